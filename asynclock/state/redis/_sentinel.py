"""Redis Sentinel: the master a service's sentinels name, served through one :class:`LeanPool`.

:class:`SentinelTransport` is RedisState's transport under Sentinel: the one-server transport
(``_plain.py``) with its pool replaced by a :class:`SentinelMaster`, and a subscriber that
asks the sentinels before every (re)connection.

redis-py's ``Sentinel`` does the discovery only (``SENTINEL MASTERS`` on each sentinel in
turn, a master that is down or not confirmed by enough sentinels is skipped). Commands keep
RedisState's lean path: plain connections to the discovered address, from a pool that is
rebuilt when the address changes.

Invariants:

* The master is looked up before the first command, and again before the next command after
  any exchange that did not end with a whole reply (a connection error, a timeout, a
  cancellation) and after a ``READONLY`` reply. Lookups are shared: one at a time.
* A ``READONLY`` reply means the server is a replica now (demoted by a failover) and refused
  the write: nothing ran, so the command is sent once more to the master the sentinels name,
  if it is another server. Otherwise it surfaces as a connection error (the master is
  unavailable until the sentinels agree on a new one).
* When the address changes, the old pool is retired: its idle connections close at once and
  busy ones when they come back, so no command goes to the old master after the switch was
  seen (except the ones already on the wire).
* A lookup is bounded by ``op_timeout`` like any operation; while no sentinel names a master
  that is up (the failover window), operations fail fast with a connection error.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors
from redis.asyncio.connection import Connection, SSLConnection

from asynclock._compat import deadline_after
from asynclock.state.redis._plain import PlainTransport
from asynclock.state.redis._pool import LeanPool, opened
from asynclock.state.redis._subscriber import Subscriber

if TYPE_CHECKING:
    from redis.asyncio.connection import AbstractConnection
    from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool

logger = logging.getLogger("asynclock")

Address = tuple[str, int]

#: connection keywords of a SentinelConnectionPool that a plain Connection must not get
_POOL_ONLY = ("connection_pool", "max_connections", "connection_class", "host", "port")


def parse_sentinel_url(url: str) -> tuple[list[Address], str, str, str]:
    """``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?query]``.

    Returns the sentinel addresses, the service name, and a ``redis://`` URL carrying the
    credentials, database and query options of the data connections (its host is a
    placeholder), plus the query alone. ``ValueError`` for a malformed URL.
    """
    rest = url.partition("://")[2]
    rest, _, query = rest.partition("?")
    userinfo, _, rest = rest.rpartition("@")
    hosts, _, path = rest.partition("/")
    sentinels: list[Address] = []
    for node in (part.strip() for part in hosts.split(",")):
        if not node:
            continue
        host, sep, port = node.rpartition(":")
        if not sep:
            host, port = node, "26379"
        if not port.isdigit():
            raise ValueError(f"bad sentinel address {node!r}")
        sentinels.append((host.strip("[]") or "127.0.0.1", int(port)))
    if not sentinels:
        raise ValueError("no sentinel host:port")
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ValueError("no service name (redis+sentinel://host:port/<service>[/db])")
    if db and not db.isdigit():
        raise ValueError(f"the database must be a number >= 0, got {db!r}")
    data = f"redis://{userinfo + '@' if userinfo else ''}localhost/{db or 0}"
    return sentinels, service, data + (f"?{query}" if query else ""), query


class SentinelMaster:
    """The lean pool of the master that ``sentinel`` names for ``service``."""

    def __init__(self, client_pool: SentinelConnectionPool, size: int, op_timeout: float) -> None:
        self._sentinel: Sentinel = client_pool.sentinel_manager
        self.service: str = client_pool.service_name
        kwargs = {k: v for k, v in client_pool.connection_kwargs.items() if k not in _POOL_ONLY}
        kwargs["socket_timeout"] = None  # RedisState bounds every operation itself
        self._kwargs = kwargs
        self._connection_class: type[AbstractConnection] = (
            SSLConnection if issubclass(client_pool.connection_class, SSLConnection) else Connection
        )
        self._size = size
        self._op_timeout = op_timeout
        self.address: Address | None = None
        self._stale = True
        self._pool = LeanPool(self.new_connection, size)
        self._lookup: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def sentinels(self) -> list[Address]:
        """The sentinels asked (the one that answered last first)."""
        out = []
        for client in self._sentinel.sentinels:
            kwargs = client.connection_pool.connection_kwargs
            out.append((str(kwargs.get("host")), int(kwargs.get("port", 26379))))
        return out

    @property
    def size(self) -> int:
        return self._size

    @property
    def opened(self) -> int:
        return self._pool.opened

    def new_connection(self, *, protocol: int | None = None) -> AbstractConnection:
        """A new (unconnected) connection to the master known now."""
        if self.address is None:
            raise redis_errors.ConnectionError(f"no master known for {self.service!r} yet")
        kwargs = dict(self._kwargs)
        kwargs["host"], kwargs["port"] = self.address
        if protocol is not None:
            kwargs["protocol"] = protocol
        conn: AbstractConnection = self._connection_class(**kwargs)
        return conn

    async def locate(self) -> None:
        """Ask the sentinels for the master now (joining a lookup already running)."""
        if self._closed:
            raise RuntimeError("the RedisState is closed")
        lookup = self._lookup
        if lookup is None or lookup.done():
            lookup = self._lookup = asyncio.get_running_loop().create_task(
                self._ask(), name="asynclock-sentinel-lookup"
            )
            lookup.add_done_callback(lambda t: t.cancelled() or t.exception())
        # shielded: a caller whose deadline runs out leaves the lookup to the others
        await asyncio.shield(lookup)

    async def _ask(self) -> None:
        async with deadline_after(self._op_timeout):
            host, port = await self._sentinel.discover_master(self.service)
        address = (str(host), int(port))
        if address != self.address:
            old, self.address = self.address, address
            if old is not None:
                logger.warning(
                    "asynclock: Redis Sentinel service %r: master moved from %s:%d to %s:%d",
                    self.service,
                    *old,
                    *address,
                )
                retired, self._pool = self._pool, LeanPool(self.new_connection, self._size)
                retired.retire()
        self._stale = False

    async def call(self, *args: str | int | bytes, retry_stale: bool = False) -> object:
        """:meth:`LeanPool.call` on the master (looked up first when it may have moved)."""
        if self._stale:
            await self.locate()
        pool = self._pool
        try:
            return await pool.call(*args, retry_stale=retry_stale)
        except redis_errors.ReadOnlyError as exc:
            await self._moved(pool, exc)
            return await self._pool.call(*args, retry_stale=retry_stale)
        except redis_errors.ResponseError:
            raise
        except BaseException:
            self._stale = True
            raise

    async def call_pair(
        self, first: tuple[str | int | bytes, ...], second: tuple[str | int | bytes, ...]
    ) -> tuple[object, object]:
        """:meth:`LeanPool.call_pair` on the master (a READONLY first reply: sent again once)."""
        if self._stale:
            await self.locate()
        pool = self._pool
        try:
            replies = await pool.call_pair(first, second)
            if isinstance(replies[0], redis_errors.ReadOnlyError):
                await self._moved(pool, replies[0])
                replies = await self._pool.call_pair(first, second)
        except BaseException:
            self._stale = True
            raise
        return replies

    async def _moved(self, pool: LeanPool, exc: redis_errors.ReadOnlyError) -> None:
        """``pool``'s server said READONLY: a replica now. Find the master, or fail."""
        self._stale = True
        await self.locate()
        if self._pool is pool:
            raise redis_errors.ConnectionError(
                f"{self.address} is a replica now ({exc}) and the sentinels of "
                f"{self.service!r} name no other master yet"
            ) from exc

    async def aclose(self, *, sentinels: bool = False) -> None:
        """Close the pool, and with ``sentinels`` the connections to the sentinels too."""
        self._closed = True
        lookup, self._lookup = self._lookup, None
        if lookup is not None and not lookup.done():
            lookup.cancel()
        await self._pool.aclose()
        for client in self._sentinel.sentinels if sentinels else ():
            await client.aclose()


class SentinelTransport(PlainTransport):
    """See :class:`~asynclock.state.redis._transport.Transport`: a :class:`SentinelMaster`
    in place of the one server's pool."""

    def __init__(self, client_pool: SentinelConnectionPool, size: int, op_timeout: float) -> None:
        """``client_pool``: the pool of a client from ``Sentinel.master_for``."""
        self._sentinel_master = SentinelMaster(client_pool, size, op_timeout)
        self.pool = self._sentinel_master
        self.where = f"Redis Sentinel service {self._sentinel_master.service!r}"

    @property
    def master(self) -> tuple[str, int] | None:
        """See :meth:`Transport.master`: the address the sentinels named last."""
        return self._sentinel_master.address

    def describe(self, where: str) -> str:
        """See :meth:`Transport.describe` (the service, and its sentinels' URL if known)."""
        return where

    def subscriber(self, op_timeout: float) -> Subscriber:
        """See :meth:`Transport.subscriber`: on the master, located before each connection."""
        master = self._sentinel_master
        return Subscriber(
            lambda: master.new_connection(protocol=2), op_timeout, locate=master.locate
        )

    async def blocking_connection(self, key: str) -> AbstractConnection:
        """See :meth:`Transport.blocking_connection`: to the master the sentinels name now."""
        master = self._sentinel_master
        await master.locate()
        return await opened(master.new_connection())

    async def aclose(self, *, owned: bool) -> None:
        """See :meth:`Transport.aclose` (``owned``: the connections to the sentinels too)."""
        await self._sentinel_master.aclose(sentinels=owned)
