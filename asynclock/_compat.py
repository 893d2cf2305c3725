"""Version shims, kept in one place."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, TypeVar

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline_after
    from asyncio import timeout_at as deadline_at
else:  # pragma: no cover - exercised on 3.10 only
    from async_timeout import timeout as deadline_after  # type: ignore[import-not-found,unused-ignore]
    from async_timeout import timeout_at as deadline_at  # type: ignore[import-not-found,unused-ignore]

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

T = TypeVar("T")

__all__ = ["cancelling", "deadline_after", "deadline_at", "kept_cancellation", "wait_set"]


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait at most ``timeout`` seconds for ``event``; whether it is set.

    Not ``asyncio.wait_for``: before Python 3.12, a cancellation that arrives as the event is set
    is lost there (``wait_for`` returns the result and the cancelled task runs on), which left a
    worker's ear listening after ``serve()`` was told to stop. A deadline keeps the cancellation.
    """
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        async with deadline_after(timeout):
            await event.wait()
    return event.is_set()


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
