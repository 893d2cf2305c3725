"""Clean-up that must finish although the task running it is being cancelled.

A cancelled acquire or release may leave a lock granted on the server with nobody to release it.
These helpers run the undoing step to its end (or in the background when nobody waits for it),
and log rather than raise its failure, since the caller is already propagating an exception.
Beside them, the one reading of a task's pending cancellations (:func:`cancelling`) and a
driver call that must not lose one (:func:`kept_cancellation`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

T = TypeVar("T")

logger = logging.getLogger("asynclock")


async def finish_despite_cancellation(work: Coroutine[object, object, object]) -> None:
    """Run clean-up ``work`` to its end even if the calling task is cancelled (again) meanwhile.

    Failures are logged, not raised: the caller is already propagating an exception. Backends
    bound every operation by their timeout, so this cannot hang.
    """
    task = asyncio.ensure_future(work)
    while not task.done():
        # asyncio.wait never cancels the task it waits for, and raises only CancelledError
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((task,))
    _log_failure(task)


async def clean_up(work: Coroutine[object, object, object], *, wait: bool) -> None:
    """Run clean-up ``work``: to its end despite cancellation, or in the background."""
    if wait:
        await finish_despite_cancellation(work)
    else:
        run_in_background(work)


def run_in_background(work: Coroutine[object, object, object]) -> None:
    """Run clean-up ``work`` without waiting for it; failures are logged."""
    task = asyncio.get_running_loop().create_task(work)
    task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Future[object]) -> None:
    if not task.done() or task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning(
            "asynclock: background clean-up failed (the lock expires by its TTL): %r", exc
        )


def body_entered(task: asyncio.Task[object] | None = None) -> tuple[asyncio.Task[object], int]:
    """The current task (``task``, if given) and its pending cancellations: what a
    :class:`BodyCanceller` made later for a body entered now needs to know."""
    if task is None:
        task = asyncio.current_task()
    if task is None:
        raise RuntimeError("a cancellable body must run in an asyncio task")
    return task, cancelling(task)


class BodyCanceller:
    """Cancels a running block of one task from outside, and tells on the way out if it did.

    The mechanism of ``asyncio.timeout``: ``Task.cancel()`` delivers a ``CancelledError`` at the
    body's next ``await``, and leaving the block takes the request back with ``Task.uncancel()``
    (Python 3.11+), so that only *our* cancellation is swallowed and one from anyone else still
    propagates. Made for every auto-renewed lock body, where the cancellation almost never
    happens: it costs two attribute reads to arm, where an anyio ``CancelScope`` costs an order of
    magnitude more. Like ``asyncio.timeout`` it cancels once: a body that catches the
    ``CancelledError`` and carries on is not cancelled again (its ``async with`` then still
    reports the loss).
    """

    __slots__ = ("_cancelling", "_requested", "_task")

    def __init__(self, entered: tuple[asyncio.Task[object], int] | None = None) -> None:
        task, pending = entered if entered is not None else body_entered()
        self._task: asyncio.Task[object] | None = task
        #: cancellations pending on entry, which are not ours to take back
        self._cancelling: int = pending
        self._requested = False

    def cancel(self) -> None:
        """Cancel the body, unless it was left already or is being cancelled by us."""
        if self._task is not None and not self._requested:
            self._requested = True
            self._task.cancel()

    def leave(self, exc_type: type[BaseException] | None) -> bool:
        """The block is over: cancel nothing more. Whether ``exc_type`` is our cancellation."""
        task, self._task = self._task, None
        if not self._requested or task is None:
            return False
        uncancel = getattr(task, "uncancel", None)
        # without uncancel (Python 3.10) a cancellation from elsewhere cannot be told apart
        ours = uncancel() <= self._cancelling if uncancel is not None else True
        return ours and exc_type is asyncio.CancelledError


async def kept_cancellation(opening: Awaitable[T], close: Callable[[T], object]) -> T:
    """``opening``'s result, or the cancellation it lost on the way.

    A driver that waits with ``asyncio.wait_for`` (aiomysql's connect) returns its result when a
    cancellation arrives just as the result is made, before Python 3.12: the cancelled task then
    runs on with the cancellation requested and never raised (a stopped worker went on to claim
    and wait for work, and ``serve()`` outlived ``aclose()``). Such a result is closed here and
    the cancellation raised again. After a return, more cancellations requested than before can
    only be lost ones: one delivered would have raised. (Python 3.10 cannot tell.)
    """
    task = asyncio.current_task()
    before = cancelling(task)
    result = await opening
    if cancelling(task) > before:
        close(result)
        raise asyncio.CancelledError
    return result


def cancelling(task: asyncio.Task[object] | None) -> int:
    """The cancellations requested of ``task`` and not taken back (``Task.cancelling``); 0 where
    that cannot be told (Python 3.10, another loop's task class, no task)."""
    if _task_cancelling is not None and isinstance(task, asyncio.Task):
        pending: int = _task_cancelling(task)
        return pending
    other = getattr(task, "cancelling", None)
    return other() if other is not None else 0


#: ``Task.cancelling`` (Python 3.11+), looked up once rather than per call: an auto-renewed lock
#: body and every state operation ask
_task_cancelling = getattr(asyncio.Task, "cancelling", None)
