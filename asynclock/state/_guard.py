"""One guard for every operation of a server state: its deadline and its errors, at one edge.

Every operation of RedisState, PostgresState and MySQLState runs as::

    async with self._guard():
        ...  # the driver calls of one operation

and leaves it either with its own result, with an error reply of the server (passed through),
or with :class:`~asynclock.StateUnavailableError`: the driver's connection errors, a timeout of
its own, and our ``op_timeout`` deadline all become one, with the driver's exception as
``__cause__`` (httpcore's ``map_exceptions``: errors are mapped where the driver is called, not
in every caller).

The deadline is not an ``asyncio.timeout`` per operation: every operation of a state has the
same budget, so deadlines fall due in the order operations start, and one timer for the oldest
serves them all (:class:`Deadlines`). A cancellation from anyone else still propagates as a
cancellation; only ours becomes StateUnavailableError.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from asynclock._cancel import cancelling
from asynclock.state._errors import unavailable_error

if TYPE_CHECKING:
    from types import TracebackType

    from asynclock._errors import StateUnavailableError

__all__ = ["Deadline", "Deadlines", "OperationGuard"]

_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)


class Deadline:
    """One operation's entry in :class:`Deadlines`: its task, when it is due, whether it expired."""

    __slots__ = ("cancelling", "due", "expired", "task")

    def __init__(self, task: asyncio.Task[object] | None, due: float) -> None:
        self.task = task
        self.due = due
        self.expired = False
        # cancellations already pending when the operation started (Python 3.11+), which are
        # not ours to take back
        self.cancelling: int = cancelling(task)

    def timed_out(self) -> bool:
        """After a ``CancelledError``: whether it came from this deadline alone.

        Takes our cancellation back (``Task.uncancel``, Python 3.11+), so a cancellation from
        anyone else still propagates as one (as ``asyncio.timeout`` does).
        """
        if not self.expired:
            return False
        uncancel = getattr(self.task, "uncancel", None)
        return uncancel is None or uncancel() <= self.cancelling


class Deadlines:
    """The operation deadlines of one state, served by one timer instead of one per operation.

    Every operation gets the same budget, so deadlines fall due in the order operations start:
    the operations in flight wait in an insertion-ordered dict, and a single timer handle, armed
    for the oldest one, cancels the tasks whose deadline passed and re-arms itself for the next.
    Starting and finishing an operation is a dict insert and delete, where ``asyncio.timeout``
    schedules and cancels a timer handle (and allocates its context manager) every time: about
    a tenth of a lock's client-side cost at a few thousand operations per second.

    The operation catches the ``CancelledError`` and asks :meth:`Deadline.timed_out` whether
    to turn it into ``TimeoutError`` (like ``asyncio.timeout``).
    """

    __slots__ = ("_budget", "_handle", "_loop", "_pending")

    def __init__(self, budget: float) -> None:
        self._budget = budget
        self._pending: dict[Deadline, None] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> Deadline:
        """The calling task's deadline, ``budget`` seconds from now."""
        loop = self._loop = asyncio.get_running_loop()
        deadline = Deadline(asyncio.current_task(loop), loop.time() + self._budget)
        self._pending[deadline] = None
        if self._handle is None:
            self._handle = loop.call_at(deadline.due, self._expire)
        return deadline

    def finish(self, deadline: Deadline) -> None:
        """The operation is over (the timer stays armed; it re-arms for what is left)."""
        self._pending.pop(deadline, None)

    def _expire(self) -> None:
        self._handle = None
        loop = self._loop
        assert loop is not None
        now = loop.time()
        while self._pending:
            deadline = next(iter(self._pending))
            if deadline.due > now:
                self._handle = loop.call_at(deadline.due, self._expire)
                return
            del self._pending[deadline]
            if deadline.task is not None and not deadline.task.done():
                deadline.expired = True
                deadline.task.cancel()


class OperationGuard:
    """The deadline and the error mapping shared by every operation of one state.

    Args:
        where: names the server without secrets (a redacted URL); the state may change it
            later (``guard.where = ...``), for example once it knows the Sentinel master.
        op_timeout: seconds one operation may take; ``None``: no deadline.
        unavailable: the driver's exceptions that mean "cannot reach the server / the
            connection is gone" (timeouts are always included).

    Invariant: an operation leaves the guard with its result, with an exception that is not
    listed (a server's error reply, a bug: passed through untouched), with a cancellation that
    is not ours, or with StateUnavailableError, whose ``__cause__`` is what the driver raised.
    """

    __slots__ = ("_deadlines", "_mapped", "op_timeout", "where")

    def __init__(
        self, where: str, op_timeout: float | None, unavailable: tuple[type[BaseException], ...]
    ) -> None:
        self.where = where
        self.op_timeout = op_timeout
        self._deadlines = Deadlines(op_timeout) if op_timeout is not None else None
        self._mapped: tuple[type[BaseException], ...] = (*unavailable, *_TIMEOUTS)

    def __call__(self) -> _Operation:
        """One operation (``async with guard():``)."""
        return _Operation(self)

    def error(self, exc: BaseException) -> StateUnavailableError:
        """The StateUnavailableError for ``exc`` (chain it: ``raise guard.error(exc) from exc``)."""
        return unavailable_error(exc, self.where, self.op_timeout)


class _Operation:
    """One guarded operation: its deadline entry, and the mapping on the way out."""

    __slots__ = ("_deadline", "_guard")

    def __init__(self, guard: OperationGuard) -> None:
        self._guard = guard
        self._deadline: Deadline | None = None

    async def __aenter__(self) -> None:
        deadlines = self._guard._deadlines
        if deadlines is not None:
            self._deadline = deadlines.start()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        guard = self._guard
        deadline = self._deadline
        if deadline is not None:
            assert guard._deadlines is not None
            guard._deadlines.finish(deadline)
        if exc is None:
            return
        if isinstance(exc, asyncio.CancelledError):
            if deadline is not None and deadline.timed_out():
                timeout = TimeoutError()
                raise guard.error(timeout) from timeout
            return
        if isinstance(exc, guard._mapped):
            raise guard.error(exc) from exc
