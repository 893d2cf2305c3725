"""Redis Cluster routing over one :class:`LeanPool` per master.

RedisState keeps its lean command path on a cluster: each command goes straight to the master
that owns its key's hash slot, through that master's own pool. redis-py's ``RedisCluster``
supplies the configuration only (startup nodes, AUTH, TLS, RESP version, timeouts); its own
``execute_command`` is not used, because it retries non-idempotent commands after a connection
error (a retried release could report a lock it had just released as lost) and fails a burst
with ``MaxConnectionsError`` instead of queueing it.

Invariants:

* The slot map comes from ``CLUSTER SLOTS`` of any reachable node (known masters first, then
  the startup nodes). It is refreshed lazily: after a ``MOVED``, a ``CLUSTERDOWN`` or a
  connection error, the next command re-reads it first (one refresh at a time).
* ``MOVED`` and ``ASK`` replies are followed, never surfaced: they mean the command did *not*
  run, so sending it again is always safe. ``ASK`` sends ``ASKING`` and the command on one
  connection of the importing node. ``TRYAGAIN`` (a multi-key command during a slot
  migration) is retried after a short pause. All of it runs under the caller's deadline.
* A script missing from a node's cache (``NOSCRIPT``: a node that never ran it, or restarted) is
  loaded on *that* node and the command sent again.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors
from redis.asyncio.connection import AbstractConnection, Connection
from redis.crc import key_slot

from asynclock.state.redis._pool import LeanPool

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.asyncio import RedisCluster
    from redis.asyncio.cluster import ClusterNode

Address = tuple[str, int]

#: error replies meaning the command did not run where it was sent (it may be sent again)
_NOT_RUN = (
    redis_errors.MovedError,
    redis_errors.AskError,
    redis_errors.TryAgainError,
    redis_errors.NoScriptError,
)

SLOTS = 16384
#: redirections followed for one command before giving up (redis-py uses the same bound)
_MAX_REDIRECTS = 16
#: TRYAGAIN: first pause, longest pause, and the longest a command keeps trying without a deadline
_TRYAGAIN_DELAY = 0.005
_MAX_TRYAGAIN_DELAY = 0.1
_TRYAGAIN_FOR = 30.0
#: connection keywords of RedisCluster that a plain Connection must not get
_CLUSTER_ONLY = (
    "max_connections",
    "connection_class",
    "response_callbacks",
    "himport_registry",
    "oss_cluster_maint_notifications_handler",
    "maint_notifications_config",
)


def slot_of(key: str | bytes) -> int:
    """The hash slot of ``key`` (its ``{hash tag}`` when it has one), as the server computes it."""
    return key_slot(key.encode() if isinstance(key, str) else key)


def startup_nodes(client: RedisCluster) -> list[ClusterNode]:
    """The nodes ``client`` was built with (redis-py 5.0 to 8: kept by its nodes manager; the
    ``RedisCluster.startup_nodes`` attribute of newer versions does not exist in 5.x)."""
    return list(client.nodes_manager.startup_nodes.values())


def _cluster_down(message: str) -> Exception:
    # redis-py < 6 leaves ClusterDownError.__init__ unannotated; called through type[Exception]
    # the call is typed on every version, and the class raised is still ClusterDownError
    error: type[Exception] = redis_errors.ClusterDownError
    return error(message)


class ClusterRouter:
    """Sends each command to the master owning its slot, following redirections."""

    def __init__(self, client: RedisCluster, pool_size: int) -> None:
        kwargs = dict(client.connection_kwargs)
        self._connection_class: type[AbstractConnection] = (
            kwargs.get("connection_class") or Connection
        )
        for name in _CLUSTER_ONLY:
            kwargs.pop(name, None)
        # every operation runs under RedisState's own deadline (see _pool.py)
        kwargs["socket_timeout"] = None
        self._kwargs = kwargs
        self._pool_size = pool_size
        self._startup: list[Address] = [(n.host, int(n.port)) for n in startup_nodes(client)]
        self._pools: dict[Address, LeanPool] = {}
        self._slots: list[Address | None] = [None] * SLOTS
        self._masters: list[Address] = []
        self._first_slots: dict[Address, int] = {}
        self._stale = True
        self._refreshing: asyncio.Lock | None = None
        self._generation = 0  # slot maps read so far
        self._closed = False

    # -- topology ---------------------------------------------------------------------------

    @property
    def masters(self) -> list[Address]:
        """The masters of the last slot map read (empty before the first command)."""
        return list(self._masters)

    def first_slot(self, address: Address) -> int:
        """The lowest slot ``address`` serves in the last slot map read."""
        return self._first_slots[address]

    def new_connection(
        self, address: Address, *, protocol: int | None = None
    ) -> AbstractConnection:
        """A new (unconnected) connection to ``address``, configured like the client's."""
        kwargs = dict(self._kwargs)
        kwargs["host"], kwargs["port"] = address
        if protocol is not None:
            kwargs["protocol"] = protocol
        conn: AbstractConnection = self._connection_class(**kwargs)
        return conn

    def pool(self, address: Address) -> LeanPool:
        """The pool of ``address`` (created on first use)."""
        pool = self._pools.get(address)
        if pool is None:
            if self._closed:
                raise RuntimeError("the RedisState is closed")
            pool = LeanPool(lambda: self.new_connection(address), self._pool_size)
            self._pools[address] = pool
        return pool

    def mark_stale(self) -> None:
        """Re-read the slot map before the next command."""
        self._stale = True

    async def address_of(self, slot: int) -> Address:
        """The master owning ``slot`` (reading the slot map first when it is stale)."""
        if self._stale:
            await self.refresh()
        address = self._slots[slot]
        if address is None:
            await self.refresh(force=True)
            address = self._slots[slot]
            if address is None:
                raise _cluster_down(f"CLUSTERDOWN hash slot {slot} is not served")
        return address

    async def refresh(self, *, force: bool = False) -> None:
        """Read the slot map from the first node that answers ``CLUSTER SLOTS``."""
        if self._refreshing is None:
            self._refreshing = asyncio.Lock()
        generation = self._generation
        async with self._refreshing:
            if not force and self._generation != generation and not self._stale:
                return  # someone else read it while we waited
            candidates = list(dict.fromkeys([*self._masters, *self._startup]))
            error: BaseException | None = None
            for address in candidates:
                try:
                    reply = await self.pool(address).call("CLUSTER", "SLOTS", retry_stale=True)
                except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError) as exc:
                    error = exc
                    continue
                except redis_errors.ResponseError as exc:  # not a cluster node, or not ready
                    error = exc
                    continue
                if self._apply(reply):
                    return
                error = _cluster_down("CLUSTERDOWN no slot is served")
            assert error is not None  # there is always at least one startup node
            raise error

    def _apply(self, reply: object) -> bool:
        if not isinstance(reply, list) or not reply:
            return False
        slots: list[Address | None] = [None] * SLOTS
        masters: dict[Address, int] = {}  # each master's lowest slot
        for entry in reply:
            start, end, master = int(entry[0]), int(entry[1]), entry[2]
            host = master[0].decode() if isinstance(master[0], bytes) else str(master[0])
            # an empty or "?" host means "the address you reached me at" (cluster-announce)
            address = (host or self._startup[0][0], int(master[1]))
            masters[address] = min(masters.get(address, start), start)
            slots[start : end + 1] = [address] * (end - start + 1)
        self._slots = slots
        self._masters = list(masters)
        self._first_slots = masters
        self._stale = False
        self._generation += 1
        return True

    # -- commands ---------------------------------------------------------------------------

    async def call(
        self,
        slot: int,
        *args: str | int | bytes,
        retry_stale: bool = False,
        script: str | None = None,
    ) -> object:
        """Run one command on the master of ``slot`` and return its reply.

        ``script``: the text of the script ``args`` runs by EVALSHA, loaded on the node that
        answers ``NOSCRIPT``. ``retry_stale`` as :meth:`LeanPool.call`.
        """
        address = await self.address_of(slot)
        asking = False
        redirects = 0
        pause, paused = _TRYAGAIN_DELAY, 0.0
        while redirects < _MAX_REDIRECTS:
            pool = self.pool(address)
            try:
                try:
                    if asking:
                        return await pool.call_asking(*args)
                    return await pool.call(*args, retry_stale=retry_stale)
                except redis_errors.NoScriptError:
                    if script is None:
                        raise
                    await pool.call("SCRIPT", "LOAD", script, retry_stale=True)
                    if asking:
                        return await pool.call_asking(*args)
                    return await pool.call(*args)
            except redis_errors.MovedError as exc:  # the slot has a new owner: the map is old
                self._slots[exc.slot_id] = address = (exc.host or address[0], int(exc.port))
                self._stale = True
                asking = False
                redirects += 1
            except redis_errors.AskError as exc:  # the slot is migrating, the key moved already
                address = (exc.host or address[0], int(exc.port))
                asking = True
                redirects += 1
            except redis_errors.TryAgainError:
                # A multi-key command (every script) on a slot being migrated, whose keys are
                # not all on one side yet: the server runs it once the slot settled. Wait for
                # that (the caller's deadline bounds it), starting over at the slot's owner.
                if paused >= _TRYAGAIN_FOR:
                    raise
                await asyncio.sleep(pause)
                paused += pause
                pause = min(pause * 2, _MAX_TRYAGAIN_DELAY)
                address = await self.address_of(slot)
                asking = False
            except redis_errors.ClusterDownError:
                self._stale = True
                raise
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                self._stale = True  # a failover may have moved the slot
                raise
        raise redis_errors.ClusterError(f"too many redirections for slot {slot}")

    async def call_each(
        self,
        commands: Sequence[tuple[int, tuple[str | int | bytes, ...]]],
        *,
        script: str | None = None,
    ) -> list[object]:
        """Run ``(slot, args)`` commands, one pipelined write per master, the masters at once.

        Returns the replies in the order of ``commands``. Each command runs at most once
        where it was sent; one that was refused there (``MOVED``, ``ASK``, ``TRYAGAIN``,
        ``NOSCRIPT``: it did not run) is sent again alone through :meth:`call`, which follows
        the redirection. Any other error reply raises. For commands that may run in any order.
        """
        for slot, _ in commands:
            await self.address_of(slot)  # the slot map, read once if stale
        by_node: dict[Address, list[int]] = {}
        for index, (slot, _) in enumerate(commands):
            address = self._slots[slot]
            assert address is not None  # address_of raised otherwise
            by_node.setdefault(address, []).append(index)

        async def on_node(address: Address, indexes: list[int]) -> list[object]:
            try:
                return await self.pool(address).call_many([commands[i][1] for i in indexes])
            except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
                self._stale = True
                raise

        groups = list(by_node.items())
        answers = await asyncio.gather(*(on_node(a, i) for a, i in groups))
        replies: list[object] = [None] * len(commands)
        for (_, indexes), answer in zip(groups, answers, strict=True):
            for index, reply in zip(indexes, answer, strict=True):
                if isinstance(reply, _NOT_RUN):
                    slot, args = commands[index]
                    reply = await self.call(slot, *args, script=script)
                elif isinstance(reply, redis_errors.ResponseError):
                    raise reply
                replies[index] = reply
        return replies

    async def call_on(self, address: Address, *args: str | int | bytes) -> object:
        """Run one command on the node at ``address`` (for per-node commands such as SCAN)."""
        try:
            return await self.pool(address).call(*args, retry_stale=True)
        except (redis_errors.ConnectionError, redis_errors.TimeoutError, OSError):
            self._stale = True
            raise

    async def aclose(self) -> None:
        """Close every pool."""
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            with contextlib.suppress(Exception):
                await pool.aclose()
