"""A lean connection pool over redis-py's own ``Connection`` objects.

redis-py's ``execute_command`` and ``BlockingConnectionPool`` spend most of a lock round trip
in the client (an ``asyncio.Condition`` and a timeout context per checkout, a liveness probe,
retry and observability wrappers), which is why peers built on them reach at best ~0.9x of
the bare command rate (research/peer-lock-benchmarks.md). RedisState needs one thing: send a
command and read its reply on an idle connection. Connections still come from redis-py
(``connection_class(**connection_kwargs)``), so AUTH, TLS, RESP3, db selection and unix
sockets behave exactly as configured on the client.

Invariants:

* At most ``size`` connections exist; a caller that finds none free queues (FIFO) instead of
  failing, bounded by the caller's own deadline.
* A connection whose exchange was interrupted (error, cancellation, timeout) is never reused:
  its reply could still arrive and be read by the next caller.
* An idle connection the server has closed (restart, ``CLIENT KILL``) is dropped at checkout,
  not handed out: a command on it would fail although the server is up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio.connection import AbstractConnection


class LeanPool:
    """Idle redis-py connections, handed out LIFO, with FIFO waiting when all are busy."""

    __slots__ = ("_closed", "_count", "_idle", "_make", "_size", "_waiters")

    def __init__(self, make: Callable[[], AbstractConnection], size: int) -> None:
        self._make = make
        self._size = size
        self._idle: list[AbstractConnection] = []
        self._count = 0
        self._waiters: deque[asyncio.Future[AbstractConnection | None]] = deque()
        self._closed = False

    @property
    def size(self) -> int:
        """The most connections this pool opens."""
        return self._size

    @property
    def opened(self) -> int:
        """Connections open right now (idle or in use)."""
        return self._count

    async def _checkout(self) -> tuple[AbstractConnection, bool]:
        """A connection and whether it was reused (an idle one) rather than new."""
        if self._closed:
            raise RuntimeError("the RedisState is closed")
        while self._idle:
            idle = self._idle.pop()
            if not _closed_by_peer(idle):
                return idle, True
            # the server closed it while it sat idle (restart, CLIENT KILL, idle timeout): a
            # command sent on it would fail after the fact, and a non-idempotent one (release,
            # SET NX) could not be retried. Drop it and use the next one, or open a new one.
            self._count -= 1
            _close_soon(idle)
        if self._count >= self._size:
            waiter: asyncio.Future[AbstractConnection | None] = (
                asyncio.get_running_loop().create_future()
            )
            self._waiters.append(waiter)
            try:
                conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._checkin(waiter.result(), broken=False)
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
            if conn is not None:
                return conn, True
            # a broken connection was dropped: its slot is ours, open a new one below
        else:
            self._count += 1
        conn = self._make()
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
        except BaseException:
            self._checkin(conn, broken=True)
            raise
        return conn, False

    def _checkin(self, conn: AbstractConnection | None, *, broken: bool) -> None:
        if broken or self._closed:
            if conn is not None:
                _close_soon(conn)
            # the slot frees: a waiter opens its own connection
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

    async def call(self, *args: str | int | bytes, retry_stale: bool = False) -> object:
        """Send one command and return its reply (an error reply raises ``ResponseError``).

        ``retry_stale``: if a reused idle connection turns out dead (the server restarted or
        closed it), try once more on a fresh one. Only for idempotent commands.
        """
        conn, reused = await self._checkout()
        try:
            await conn.send_packed_command(pack(args), check_health=False)
            reply = await conn.read_response()
        except redis_errors.ResponseError:
            self._checkin(conn, broken=False)  # the reply was read whole: the stream is in sync
            raise
        except (redis_errors.ConnectionError, ConnectionError, OSError):
            self._checkin(conn, broken=True)
            if retry_stale and reused:
                return await self.call(*args, retry_stale=False)
            raise
        except BaseException:
            self._checkin(conn, broken=True)
            raise
        self._checkin(conn, broken=False)
        return reply

    async def call_asking(self, *args: str | int | bytes) -> object:
        """``ASKING`` and then one command on the same connection (a Redis Cluster ``ASK``).

        ``ASKING`` lets the next command of its connection run on a node that is importing the
        command's slot; both go out in one write. Returns the command's reply.
        """
        conn, _ = await self._checkout()
        try:
            await conn.send_packed_command(pack(("ASKING",)) + pack(args), check_health=False)
            try:
                await conn.read_response()  # +OK
            finally:
                reply = await conn.read_response()
        except redis_errors.ResponseError:
            self._checkin(conn, broken=False)
            raise
        except BaseException:
            self._checkin(conn, broken=True)
            raise
        self._checkin(conn, broken=False)
        return reply

    async def call_pair(
        self, first: tuple[str | int | bytes, ...], second: tuple[str | int | bytes, ...]
    ) -> tuple[object, object]:
        """Two commands in one write on one connection (``WAIT`` right after a script).

        Returns both replies; an error reply is returned as its ``ResponseError``, not raised,
        so that the caller sees what the second command said whatever the first said.
        """
        conn, _ = await self._checkout()
        replies: list[object] = []
        try:
            await conn.send_packed_command(pack(first) + pack(second), check_health=False)
            replies.append(await _reply_or_error(conn))
            replies.append(await _reply_or_error(conn))
        except BaseException:
            self._checkin(conn, broken=True)
            raise
        self._checkin(conn, broken=False)
        return replies[0], replies[1]

    def retire(self) -> None:
        """Stop reusing connections (the server behind them is no longer the one to talk to).

        Idle connections close now, busy ones when they come back; callers queued here are
        still served, on new connections from ``make``; new callers are refused as after
        :meth:`aclose`.
        """
        self._closed = True
        idle, self._idle = self._idle, []
        self._count -= len(idle)
        for conn in idle:
            _close_soon(conn)

    async def aclose(self) -> None:
        """Close every idle connection; busy ones close when they come back."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.disconnect()
        self._count -= len(idle)
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.cancel()


def pack(args: tuple[str | int | bytes, ...]) -> bytes:
    """Encode one command in RESP (UTF-8 strings, decimal integers).

    A few times cheaper than redis-py's general ``pack_command``, which dominated the client's
    share of a lock round trip.
    """
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int):
            data = b"%d" % arg
        else:
            data = arg
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


async def _reply_or_error(conn: AbstractConnection) -> object:
    """One reply; an error reply is returned (read whole: the stream stays in sync)."""
    try:
        return await conn.read_response()
    except redis_errors.ResponseError as exc:
        return exc


def _closed_by_peer(conn: AbstractConnection) -> bool:
    """Whether the server's end of the idle ``conn`` is known closed (EOF or error seen).

    Reads only what the event loop recorded already (no system call): the EOF of a connection
    the server closed while idle reaches its stream reader without anyone reading.
    """
    reader: asyncio.StreamReader | None = getattr(conn, "_reader", None)
    return reader is None or reader.at_eof() or reader.exception() is not None


def _close_soon(conn: AbstractConnection) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - no loop: nothing left to do
        return
    task = loop.create_task(conn.disconnect(nowait=True))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
