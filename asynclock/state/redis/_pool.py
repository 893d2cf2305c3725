"""A lean connection pool over redis-py's own ``Connection`` objects.

redis-py's ``execute_command`` and ``BlockingConnectionPool`` spend most of a lock round trip
in the client (an ``asyncio.Condition`` and a timeout context per checkout, a liveness probe,
retry and observability wrappers), which is why peers built on them reach at best ~0.9x of
the bare command rate (see docs/benchmarks.md). RedisState needs one thing: send a
command and read its reply on an idle connection. Connections still come from redis-py
(``connection_class(**connection_kwargs)``), so AUTH, TLS, RESP3, db selection and unix
sockets behave exactly as configured on the client.

The checkout rules (bounded, FIFO waiting, interrupted connections never reused, idle ones the
server closed dropped) and the one retry of a command on a stale connection are
:class:`asynclock.state._pool.ConnectionPool`'s, shared with the SQL states: this module only
says how a command is sent and read, and which errors mean "error reply" or "connection lost".
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from redis import exceptions as redis_errors

from asynclock.state._pool import ConnectionPool

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

    from redis.asyncio.connection import AbstractConnection


class ServerPool(Protocol):
    """The connections to one Redis server that a transport sends its commands on: a
    :class:`LeanPool`, or a Sentinel-named master's (``_sentinel.SentinelMaster``, which finds
    the master again when it moves). The transports type against this, not against either."""

    @property
    def size(self) -> int:
        """Connections it keeps at most."""
        ...

    @property
    def opened(self) -> int:
        """Connections open now."""
        ...

    def call(
        self, *args: str | int | bytes, retry_stale: bool = False
    ) -> Coroutine[object, object, object]:
        """One command, its reply (see :meth:`LeanPool.call`)."""
        ...

    async def call_pair(
        self, first: tuple[str | int | bytes, ...], second: tuple[str | int | bytes, ...]
    ) -> tuple[object, object]:
        """Two commands in one write on one connection (see :meth:`LeanPool.call_pair`)."""
        ...

    async def aclose(self) -> None:
        """Close every connection."""
        ...


class LeanPool(ConnectionPool["AbstractConnection"]):
    """Idle redis-py connections (a :class:`ConnectionPool`) and the commands sent on them."""

    __slots__ = ()

    def __init__(self, make: Callable[[], AbstractConnection], size: int) -> None:
        async def connect() -> AbstractConnection:
            return await opened(make())

        async def close(conn: AbstractConnection) -> None:
            await conn.disconnect()

        super().__init__(connect, _close_soon, close, size, alive=_alive)

    def call(
        self, *args: str | int | bytes, retry_stale: bool = False
    ) -> Coroutine[object, object, object]:
        """Send one command and return its reply (an error reply raises ``ResponseError``).

        ``retry_stale``: if a reused idle connection turns out dead (the server restarted or
        closed it), try once more on a fresh one. Only for idempotent commands.
        """
        # every command's path: the exchange's coroutine is handed back to be awaited, not
        # awaited in a frame of its own (about 1% of a bare SET + GET round trip)
        return self.exchange(
            _error_reply, _lost if retry_stale else None, _send_and_read, pack(args)
        )

    async def call_asking(self, *args: str | int | bytes) -> object:
        """``ASKING`` and then one command on the same connection (a Redis Cluster ``ASK``).

        ``ASKING`` lets the next command of its connection run on a node that is importing the
        command's slot; both go out in one write. Returns the command's reply.
        """
        return await self.exchange(_error_reply, None, _send_asking, pack(("ASKING",)) + pack(args))

    async def call_pair(
        self, first: tuple[str | int | bytes, ...], second: tuple[str | int | bytes, ...]
    ) -> tuple[object, object]:
        """Two commands in one write on one connection (``WAIT`` right after a script).

        Returns both replies; an error reply is returned as its ``ResponseError``, not raised,
        so that the caller sees what the second command said whatever the first said.
        """
        replies = await self.call_many((first, second))
        return replies[0], replies[1]

    async def call_many(self, commands: Sequence[tuple[str | int | bytes, ...]]) -> list[object]:
        """Commands in one write on one connection (a pipeline); their replies, in order.

        An error reply is returned as its ``ResponseError``, not raised (each reply is read
        whole, so the stream stays in sync whatever one command said).
        """
        packed = b"".join(pack(command) for command in commands)
        return await self.exchange(_error_reply, None, _send_and_read_all, packed, len(commands))

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


async def opened(conn: AbstractConnection) -> AbstractConnection:
    """``conn``, connected (closed again if connecting fails)."""
    try:
        await conn.connect()  # type: ignore[no-untyped-call]
    except BaseException:
        _close_soon(conn)
        raise
    return conn


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


async def _send_and_read(conn: AbstractConnection, packed: bytes) -> object:
    """Send one command and read its reply (an error reply raises ``ResponseError``)."""
    await conn.send_packed_command(packed, check_health=False)
    return await conn.read_response()


async def _send_asking(conn: AbstractConnection, packed: bytes) -> object:
    """Send ``ASKING`` and a command in one write; the command's reply.

    An error reply to either raises ``ResponseError`` only once both replies are read, so the
    stream stays in sync.
    """
    await conn.send_packed_command(packed, check_health=False)
    try:
        await conn.read_response()  # +OK
    finally:
        reply = await conn.read_response()
    return reply


async def _send_and_read_all(conn: AbstractConnection, packed: bytes, replies: int) -> list[object]:
    """Send ``packed`` and read its ``replies`` replies, error replies returned, not raised."""
    await conn.send_packed_command(packed, check_health=False)
    return [await _reply_or_error(conn) for _ in range(replies)]


def _error_reply(exc: BaseException) -> bool:
    """The server answered an error, read whole: the connection is in sync, still usable."""
    return isinstance(exc, redis_errors.ResponseError)


def _lost(exc: BaseException) -> bool:
    """The connection is gone (on a reused idle one: the server closed it meanwhile)."""
    return isinstance(exc, (redis_errors.ConnectionError, ConnectionError, OSError))


async def _reply_or_error(conn: AbstractConnection) -> object:
    """One reply; an error reply is returned (read whole: the stream stays in sync)."""
    try:
        return await conn.read_response()
    except redis_errors.ResponseError as exc:
        return exc


def _alive(conn: AbstractConnection) -> bool:
    """Whether the server's end of the idle ``conn`` is still open (no EOF or error seen).

    Reads only what the event loop recorded already (no system call): the EOF of a connection
    the server closed while idle reaches its stream reader without anyone reading.
    """
    reader: asyncio.StreamReader | None = getattr(conn, "_reader", None)
    return reader is not None and not reader.at_eof() and reader.exception() is None


def _close_soon(conn: AbstractConnection) -> None:
    """Close ``conn`` without awaiting, at once where redis-py can.

    ``disconnect()`` is a coroutine: a task made for it may never run (a loop that ends cancels
    it before its first step), and the connection then warns of its open socket when collected.
    redis-py from 5.1 closes a connection at once with ``_close()`` (what its own ``__del__``
    does); with an older one, a task disconnects it.
    """
    close_now: Callable[[], None] | None = getattr(conn, "_close", None)
    if close_now is not None:
        close_now()
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # pragma: no cover - no loop: nothing left to do
        return
    task = loop.create_task(conn.disconnect(nowait=True))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())
