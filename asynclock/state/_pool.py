"""A small connection pool shared by the server states (Redis's lean pool, the SQL states).

Connections come from the backend's own driver (``connect``); the pool only hands them out.

Invariants:

* At most ``size`` connections exist; a caller that finds none free queues (FIFO) instead of
  failing, bounded by the caller's own deadline.
* A connection whose exchange was interrupted (error, cancellation, timeout) is checked in as
  ``broken`` and never reused: its reply could still arrive and be read by the next caller.
* An idle connection the server closed meanwhile (``alive`` says so) is dropped at checkout,
  not handed out: a command on it would fail although the server is up.
* :meth:`ConnectionSource.exchange` runs one exchange with that bookkeeping, and retries it
  once, on a new connection, when a reused idle one turns out dead (the backend says which
  errors mean that). Redis's lean pool and the SQL states both go through it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Generic, ParamSpec, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from typing import Concatenate

__all__ = ["ConnectionPool", "ConnectionSource"]

C = TypeVar("C")
R = TypeVar("R")
P = ParamSpec("P")


class ConnectionSource(abc.ABC, Generic[C]):
    """Where operations get a connection, and the one way they run an exchange on it.

    :class:`ConnectionPool` is the usual one; a state can also take connections from a pool
    its user owns (PostgreSQL's ``asyncpg.Pool``), which keeps its own reuse rules.
    """

    __slots__ = ()

    @abc.abstractmethod
    async def checkout(self) -> tuple[C, bool]:
        """A connection, and whether it was reused (idle) rather than opened for this call."""

    @abc.abstractmethod
    def checkin(self, conn: C | None, *, broken: bool) -> None:
        """Give ``conn`` back; a ``broken`` one is closed, never handed out again."""

    def discard_idle(self) -> None:
        """An idle connection turned out dead: close the other idle ones (if the source can)."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close what the source opened."""

    async def exchange(
        self,
        in_sync: Callable[[BaseException], bool],
        stale: Callable[[BaseException], bool] | None,
        run: Callable[Concatenate[C, P], Awaitable[R]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R:
        """``run(conn, *args, **kwargs)`` on a checked-out connection, and the connection back.

        Args:
            in_sync: whether an exception left the connection usable (the server's error
                reply, read whole): it is checked in and the exception raised. Any other
                exception (lost connection, cancellation, timeout) checks the connection in as
                broken, since a reply could still arrive on it.
            stale: whether an exception on a *reused* connection means it was dead before the
                exchange could do anything (never sent, or safe to repeat); then the exchange
                runs once more, on a new connection. ``None``: never retried.

        The retry discards the other idle connections first: the server closed this one while
        it sat idle (restart, failover, a kill of the application's sessions), most likely the
        others with it, and they may not show it yet.
        """
        conn, reused = await self.checkout()
        try:
            answer = await run(conn, *args, **kwargs)
        except BaseException as exc:
            if in_sync(exc):
                self.checkin(conn, broken=False)
                raise
            self.checkin(conn, broken=True)
            if not (reused and stale is not None and stale(exc)):
                raise
        else:
            self.checkin(conn, broken=False)
            return answer
        self.discard_idle()
        return await self.exchange(in_sync, None, run, *args, **kwargs)


class ConnectionPool(ConnectionSource[C]):
    """Idle connections handed out LIFO, with FIFO waiting when all ``size`` are busy.

    asyncpg's own pool runs a reset query on every release (one more round trip per operation)
    and aiomysql's pool pings; redis-py's pools add a condition and a timeout context per
    checkout. The states need none of it: every operation is one command or one autocommit
    statement, so a connection between two operations carries no state, and one whose exchange
    was interrupted is discarded, because its reply may still arrive.
    """

    __slots__ = (
        "_alive",
        "_close",
        "_closed",
        "_connect",
        "_count",
        "_discard",
        "_idle",
        "_size",
        "_waiters",
    )

    def __init__(
        self,
        connect: Callable[[], Awaitable[C]],
        discard: Callable[[C], None],
        close: Callable[[C], Awaitable[None]],
        size: int,
        alive: Callable[[C], bool] | None = None,
    ) -> None:
        self._alive = alive
        self._connect = connect
        self._discard = discard
        self._close = close
        self._size = size
        self._idle: list[C] = []
        self._count = 0
        self._waiters: deque[asyncio.Future[C | None]] = deque()
        self._closed = False

    @property
    def size(self) -> int:
        """The most connections this pool opens."""
        return self._size

    @property
    def opened(self) -> int:
        """Connections open right now (idle or in use)."""
        return self._count

    async def checkout(self) -> tuple[C, bool]:
        """A connection, and whether it was reused (idle) rather than opened for this call."""
        if self._closed:
            raise RuntimeError("the state is closed")
        while self._idle:
            idle = self._idle.pop()
            if self._alive is None or self._alive(idle):
                return idle, True
            # the server closed it while it sat idle (terminated, KILLed, restarted): a
            # statement on it would fail although the server is up, and a non-idempotent one
            # could not be retried; drop it and use the next one, or open a new one
            self._count -= 1
            self._discard(idle)
        if self._count >= self._size:
            waiter: asyncio.Future[C | None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    # handed a connection, or (``None``) the slot of a broken one: pass it on
                    handed = waiter.result()
                    self.checkin(handed, broken=handed is None)
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
            if conn is not None:
                return conn, True
            # a broken connection was dropped: its slot is ours, open a new one below
        else:
            self._count += 1
        try:
            conn = await self._connect()
        except BaseException:
            self.checkin(None, broken=True)
            raise
        return conn, False

    def checkin(self, conn: C | None, *, broken: bool) -> None:
        """Give ``conn`` back; a ``broken`` one is closed and its slot handed on."""
        if broken or self._closed:
            if conn is not None:
                self._discard(conn)
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
            self._count -= 1
            return
        assert conn is not None
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        self._idle.append(conn)

    def discard_idle(self) -> None:
        """Close every idle connection now: the next checkout opens a new one.

        For when one idle connection turned out dead although ``alive`` passed it: the server
        closed it while it sat idle, and most likely the others with it (a restart, every
        session of the application terminated). They may not show it yet: the server's goodbye
        can be read before its end of stream, and a statement on such a connection fails.
        """
        idle, self._idle = self._idle, []
        self._count -= len(idle)
        for conn in idle:
            self._discard(conn)

    async def aclose(self) -> None:
        """Close every idle connection; busy ones are closed when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        self._count -= len(idle)
        for conn in idle:
            try:
                await self._close(conn)
            except Exception:  # noqa: BLE001, PERF203 - closing anyway; the socket is dropped here
                self._discard(conn)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.cancel()
