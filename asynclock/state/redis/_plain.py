"""One Redis server: the :class:`~asynclock.state.redis._transport.Transport` of a plain client.

Commands go out on a :class:`~asynclock.state.redis._pool.LeanPool` of connections configured
like the client's (``redis://``, ``rediss://``, ``unix://``); the client's own pool is not used.
:class:`~asynclock.state.redis._sentinel.SentinelTransport` is this transport with the pool
pointed at the master the sentinels name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from asynclock.state.redis._pool import LeanPool, opened
from asynclock.state.redis._ready import ReadySet
from asynclock.state.redis._subscriber import Subscriber
from asynclock.state.redis._transport import LockKeys

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping

    from redis.asyncio import Redis
    from redis.asyncio.connection import AbstractConnection

    from asynclock.state._guard import OperationGuard
    from asynclock.state.redis._pool import ServerPool
    from asynclock.state.redis._ready import Command, ReadyIndex
    from asynclock.state.redis._transport import Args, Script

__all__ = ["PlainTransport"]


class PlainTransport:
    """See :class:`~asynclock.state.redis._transport.Transport`: one server, one lean pool."""

    clustered = False

    def __init__(self, client: Redis, size: int, where: str) -> None:
        self._client = client
        self.where = where
        #: where the commands go (a :class:`SentinelMaster` under Sentinel)
        self.pool: ServerPool = LeanPool(lambda: connection_for(client), size)

    @property
    def master(self) -> tuple[str, int] | None:
        """See :meth:`Transport.master` (not Sentinel: ``None``)."""
        return None

    def describe(self, where: str) -> str:
        """See :meth:`Transport.describe` (the address alone)."""
        return where.removeprefix("Redis at ")

    def lock_keys(self, prefix: str) -> LockKeys:
        """See :meth:`Transport.lock_keys`."""
        return LockKeys(prefix)

    async def eval(
        self, script: Script, keys: tuple[str, ...], args: Args, idempotent: bool = False
    ) -> object:
        """See :meth:`Transport.eval`."""
        call = self.pool.call
        try:
            return await call(
                "EVALSHA", script.sha, len(keys), *keys, *args, retry_stale=idempotent
            )
        except redis_errors.NoScriptError:
            await call("SCRIPT", "LOAD", script.text)
            return await call("EVALSHA", script.sha, len(keys), *keys, *args)

    async def eval_waited(
        self, script: Script, keys: tuple[str, ...], args: Args, wait: Args
    ) -> tuple[object, object]:
        """See :meth:`Transport.eval_waited` (WAIT counts the replicas that have this
        connection's writes, hence the one connection)."""
        pool = self.pool
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        reply, acks = await pool.call_pair(command, wait)
        if isinstance(reply, redis_errors.NoScriptError):
            await pool.call("SCRIPT", "LOAD", script.text)
            reply, acks = await pool.call_pair(command, wait)
        return reply, acks

    async def command(self, key: str, *args: str | int | bytes) -> object:
        """See :meth:`Transport.command`."""
        return await self.pool.call(*args)

    async def scan(self, pattern: str) -> AsyncGenerator[list[str], None]:
        """See :meth:`Transport.scan`."""
        async for page in scan_pages(self.pool.call, pattern):
            yield page

    async def each_master(self, *args: str | int | bytes) -> list[tuple[str, object]]:
        """See :meth:`Transport.each_master`: the one server (the master, under Sentinel)."""
        reply = await self.pool.call(*args)
        master = self.master
        address = self.describe(self.where) if master is None else f"{master[0]}:{master[1]}"
        return [(address, reply)]

    def subscriber(self, op_timeout: float) -> Subscriber:
        """See :meth:`Transport.subscriber`: one pub/sub connection like the client's."""
        client = self._client
        return Subscriber(lambda: subscriber_connection(client), op_timeout)

    async def blocking_connection(self, key: str) -> AbstractConnection:
        """See :meth:`Transport.blocking_connection`."""
        return await opened(connection_for(self._client))

    def ready_index(
        self,
        prefix: str,
        command: Command,
        guard: OperationGuard,
        scripts: Mapping[str, Script],
    ) -> ReadyIndex:
        """See :meth:`Transport.ready_index`: one sorted set."""
        return ReadySet(prefix, command)

    async def aclose(self, *, owned: bool) -> None:
        """See :meth:`Transport.aclose`."""
        await self.pool.aclose()


async def scan_pages(
    call: Callable[[str, bytes | int | str, str, str, str, int], Awaitable[object]], pattern: str
) -> AsyncIterator[list[str]]:
    """``SCAN`` with ``pattern`` through ``call`` (one node), one list of keys per page."""
    cursor: bytes | int | str = 0
    while True:
        reply = await call("SCAN", cursor, "MATCH", pattern, "COUNT", 500)
        assert isinstance(reply, list)
        cursor, keys = reply
        yield [raw.decode() if isinstance(raw, bytes) else str(raw) for raw in keys]
        if int(cursor) == 0:
            return


def connection_for(client: Redis, **overrides: object) -> AbstractConnection:
    """A new connection configured like ``client``'s (and ``overrides``), minus the per-read
    socket timeout.

    Every operation runs under RedisState's own ``op_timeout`` deadline instead, and a reply is
    read whole or the connection is dropped, so a per-read timeout adds cost and nothing else.
    """
    pool = client.connection_pool
    kwargs = {**pool.connection_kwargs, "socket_timeout": None, **overrides}
    conn: AbstractConnection = pool.connection_class(**kwargs)
    return conn


def subscriber_connection(client: Redis) -> AbstractConnection:
    """A new pub/sub connection like ``client``'s: no read timeout (it blocks on reads by
    design), RESP2 (pub/sub arrays)."""
    return connection_for(client, protocol=2)
