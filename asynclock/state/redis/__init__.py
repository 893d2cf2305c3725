"""RedisState: locks and dedupe records in Redis, through redis-py's ``redis.asyncio``.

Size: a little over 500 lines: every operation of State, ClaimingState, FairState and
LockAdmin, each a few lines around one script, written once for every topology (what differs
by topology is in the transports, see below; the inbox's operations are in ``_inbox.py``).

Semaphores (``SemaphoreState``) are the mixin of ``_semaphore.py``: one ``semaphore_*.lua``
script per operation, keys ``P{key}:semaphore:*``.

Every lock operation is one EVALSHA of a script in this folder (``acquire.lua``,
``release.lua``, ``extend.lua``, ``inspect.lua``, each prefixed with ``_value.lua``), so it is
atomic against every client of the server and uses the server's clock. Dedupe is one
``SET NX PX``. Key layout (``P`` is the prefix):

* ``P{key}``: the lock (see ``_value.lua`` for its value); the braces make the user's key the
  Redis Cluster hash tag, so everything about one lock lives in one slot.
* ``P{key}:released``: the lock's release channel (PUBLISH from ``release.lua``).
* ``P{key}:supersede``: the holder's supersede channel (PUBLISH from ``supersede.lua``, the
  payload the holder's fencing token; see :class:`~asynclock.state.SupersedeSignals`).
* ``P{key}:carried``: the events an interrupted holder left for the key's next call
  (``supersede_carry.lua``, taken by ``supersede_collect.lua``).
* ``P<namespace>:<id>``: a dedupe record.
* ``P{key}:inbox`` (and ``:attempts``, ``:tries``, ``:dead``, ``:seq``, ``:hold``): the key's
  durable inbox (``:tries``: the attempt counts of the entries ``inbox_take`` handed out;
  ``:hold``: a retry's due time, or the key's parking, see ``_hold.lua``); the set of
  keys with work and the wake-up channel are the ready index's (``_ready.py``: one set on one
  server; one per slot and a directory on a cluster, ``_cluster_inbox.py``).

The topology is a *transport* (``_transport.py``), chosen once by the client's type
(``_clients.py``, which also builds clients from URLs); this class holds no topology branch.
Every transport call runs under the state's :class:`~asynclock.state._guard.OperationGuard`.

On Redis Cluster (``redis+cluster://`` or a ``RedisCluster`` client) the same scripts run on
the master owning the key's slot (``_cluster.py``: per-master pools, ``MOVED``/``ASK``
followed), and release channels are sharded: the scripts ``SPUBLISH`` instead of ``PUBLISH``
and waiters ``SSUBSCRIBE`` on that master (``_subscriber.py``).

Under Redis Sentinel (``redis+sentinel://`` or a client from ``Sentinel.master_for``) the
sentinels name the master and ``_sentinel.py`` keeps the lean pool pointed at it, looking it up
again after a connection error or a ``READONLY`` reply. With ``replicas=N`` every successful
acquire, extend and handoff is followed by ``WAIT N`` on the same connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from asynclock._errors import StateUnavailableError
from asynclock._owner import new_process_id
from asynclock._validate import check_key, check_seconds, check_ttl, ttl_ms
from asynclock.state._base import ClosesOnExit
from asynclock.state._guard import OperationGuard
from asynclock.state._protocol import Grant, LockInfo, Release
from asynclock.state._url import StateURL
from asynclock.state._watch import EventWatch, TokenWatch
from asynclock.state.redis._clients import client_from_url, transport_for
from asynclock.state.redis._durability import PersistenceCheck
from asynclock.state.redis._inbox import RedisInbox
from asynclock.state.redis._scripts import as_int as _as_int
from asynclock.state.redis._scripts import load_scripts
from asynclock.state.redis._scripts import text as _text
from asynclock.state.redis._semaphore import RedisSemaphores
from asynclock.state.redis._transport import UNAVAILABLE

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.connection import AbstractConnection

    from asynclock.state.redis._pool import ServerPool
    from asynclock.state.redis._ready import ReadyIndex
    from asynclock.state.redis._subscriber import ShardedSubscriber, Subscriber
    from asynclock.state.redis._transport import Transport

__all__ = ["RedisState"]

#: every script of the state, by name (kept under its old name: tests load them through it)
_scripts = load_scripts


class RedisState(RedisInbox, RedisSemaphores, ClosesOnExit):
    """Locks and dedupe records in Redis, shared by every process that uses the same server.

    Invariants:

    * Acquire, release, extend and dedupe are each one atomic server-side step; expiry is the
      server's (``PX``), never the client's clock.
    * Fencing tokens strictly increase per key (see ``acquire.lua``).
    * Every operation either answers within ``op_timeout`` seconds or raises
      :class:`~asynclock.StateUnavailableError`; nothing hangs on a dead server.
    * A state built by :meth:`from_url` owns its client and closes it; a state given a client
      never closes it.

    One RedisState serves one event loop (redis-py's connections belong to a loop).

    On Redis Cluster every script touches only keys sharing the lock key's hash tag, so it runs
    whole on the master owning that slot; ``MOVED``/``ASK`` redirections (resharding, failover)
    are followed, never surfaced; release wake-ups use sharded pub/sub (Redis 7+).

    Args:
        client: a ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster`` client (its
            configuration is used: this state opens its own connections, per master on a
            cluster). RESP2 or RESP3 both work.
        prefix: put in front of every key, so applications sharing a server never meet.
            Must not contain ``{`` or ``}`` (they would change the Cluster hash tag).
        op_timeout: seconds one operation may take, connection wait included.
        token_retention: seconds a released key remembers its last fencing token.
        reservation: seconds a release keeps the lock reserved for a waiter of another process
            that asked for a turn, before anyone may take it.
        replicas: after every successful acquire, extend and handoff, wait (``WAIT``) until this
            many replicas confirmed the write. Fewer within ``replica_timeout``: an acquire is
            undone and raises StateUnavailableError, an extend raises it, a handoff falls back
            to a normal acquire by the successor (see docs/backends.md, Redis Sentinel).
            0 (the default) never waits. Not supported on Redis Cluster.
        replica_timeout: seconds ``WAIT`` may take; less than ``op_timeout``.
        check_persistence: the durable inbox's first ``accept`` or ``serve()`` reads
            ``INFO persistence`` of every master once, and logs one warning when a master keeps
            no append-only file (its accepted events would not survive a restart of the
            server). ``False`` skips the check (a server made durable by other means).
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        *,
        prefix: str = "asynclock:",
        op_timeout: float = 5.0,
        token_retention: float = 60.0,
        reservation: float = 0.25,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        check_persistence: bool = True,
    ) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if "{" in prefix or "}" in prefix:
            raise ValueError(f"prefix must not contain '{{' or '}}', got {prefix!r}")
        self._client = client
        self._prefix = prefix
        self._op_timeout = check_seconds(op_timeout, "op_timeout")
        self._retention_ms = ttl_ms(check_ttl(token_retention, "token_retention"))
        self._reservation_ms = ttl_ms(check_ttl(reservation, "reservation"))
        self._owns_client = False
        self._process = new_process_id()
        self._subscriber: Subscriber | ShardedSubscriber | None = None
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ValueError(f"replicas must be an int >= 0, got {replicas!r}")
        self._replicas = replicas
        wait_for = check_seconds(replica_timeout, "replica_timeout")
        if replicas and wait_for is not None and wait_for >= (self._op_timeout or float("inf")):
            raise ValueError(
                f"replica_timeout ({replica_timeout}) must be less than op_timeout "
                f"({op_timeout}): WAIT runs inside the operation's deadline"
            )
        self._replica_timeout_ms = ttl_ms(wait_for or 1.0)
        if not isinstance(check_persistence, bool):
            raise TypeError(
                f"check_persistence must be a bool, got {type(check_persistence).__name__}"
            )
        self._persistence = PersistenceCheck(enabled=check_persistence)
        #: acquires, extends and handoffs that fewer than ``replicas`` replicas confirmed
        self.replica_shortfalls = 0
        transport = transport_for(client, replicas=replicas, op_timeout=self._op_timeout or 5.0)
        self._transport: Transport = transport
        self._guard = OperationGuard(transport.where, self._op_timeout, UNAVAILABLE)
        self._keys = transport.lock_keys(prefix)
        self._scripts = _scripts(sharded=transport.clustered)
        # where the inbox's keys with work are kept: one set, or one per slot on a cluster
        self._ready: ReadyIndex = transport.ready_index(
            prefix, self._command, self._guard, self._scripts
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock:",
        connect_timeout: float = 5.0,
        op_timeout: float = 5.0,
        max_connections: int = 50,
        token_retention: float = 60.0,
        reservation: float = 0.25,
        replicas: int = 0,
        replica_timeout: float = 1.0,
        check_persistence: bool = True,
    ) -> RedisState:
        """Build a state (and its own client) from a ``redis://``, ``rediss://``, ``unix://``,
        ``redis+cluster://`` or ``redis+sentinel://`` URL.

        The client uses a blocking pool of ``max_connections``: a burst of concurrent operations
        waits for a free connection (within ``op_timeout``) instead of failing with
        "Too many connections". It has no per-read socket timeout and no automatic retries: each
        operation runs under one ``op_timeout`` deadline instead (cheaper than redis-py's
        per-command ``wait_for``), and a retried release could report a lock it had just released
        as lost.
        """
        StateURL(url)  # the scheme first: an unknown one is the error to report
        check_seconds(connect_timeout, "connect_timeout")
        op = check_seconds(op_timeout, "op_timeout")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        client, where = client_from_url(
            url,
            connect_timeout=connect_timeout,
            op_timeout=op,
            max_connections=max_connections,
            replicas=replicas,
        )
        state = cls(
            client,
            prefix=prefix,
            op_timeout=op_timeout,
            token_retention=token_retention,
            reservation=reservation,
            replicas=replicas,
            replica_timeout=replica_timeout,
            check_persistence=check_persistence,
        )
        state._owns_client = True
        state._guard.where = where
        return state

    def __repr__(self) -> str:
        where = self._transport.describe(self._guard.where)
        return f"RedisState({where}, prefix={self._prefix!r})"

    async def aclose(self) -> None:
        """Close the subscriber, and the client when this state built it."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            await subscriber.aclose()
        await self._ready.aclose()
        await self._transport.aclose(owned=self._owns_client)
        if self._owns_client:
            await self._client.aclose()
        else:
            await asyncio.sleep(0)

    @property
    def client(self) -> Redis | RedisCluster:
        """The redis-py client this state talks through."""
        return self._client

    @property
    def clustered(self) -> bool:
        """Whether this state talks to a Redis Cluster."""
        return self._transport.clustered

    @property
    def master(self) -> tuple[str, int] | None:
        """Under Redis Sentinel: the master's address as last named by the sentinels."""
        return self._transport.master

    @property
    def replicas(self) -> int:
        """Replicas that must confirm every acquire, extend and handoff (``WAIT``); 0: none."""
        return self._replicas

    @property
    def prefix(self) -> str:
        """The prefix of every key this state writes."""
        return self._prefix

    def lock_key(self, key: str) -> str:
        """The Redis key that holds lock ``key``.

        ``P{key}``. On a cluster, a key starting with ``{`` or ``}`` gets one more ``{`` in
        front (``P{{key}``): ``P{}x}`` would have an empty hash tag, and Redis would then hash
        each whole key name, scattering the lock's keys over different slots. The extra brace
        keeps the tag non-empty and the layout one-to-one (the transport's ``LockKeys``).
        """
        return self._keys.lock_key(key)

    @property
    def _pool(self) -> ServerPool:
        """The connection pool of one server (Sentinel: the master's); a cluster has one per
        master, in its router, and no such attribute."""
        pool = self._transport.pool
        if pool is None:
            raise AttributeError("a clustered RedisState has one pool per master")
        return pool

    # -- plumbing ---------------------------------------------------------------------------

    async def _eval(
        self, name: str, keys: tuple[str, ...], *args: str | int, idempotent: bool = False
    ) -> object:
        """Run script ``name`` (``idempotent``: a stale idle connection may be retried)."""
        async with self._guard():
            return await self._transport.eval(self._scripts[name], keys, args, idempotent)

    async def _eval_waited(
        self, name: str, keys: tuple[str, ...], *args: str | int
    ) -> tuple[object, int | None]:
        """:meth:`_eval`, then ``WAIT replicas replica_timeout`` in the same write on the same
        connection (WAIT counts the replicas that have this connection's writes). Returns the
        script's reply and the replicas that confirmed (``None`` when ``replicas`` is 0)."""
        wait = ("WAIT", self._replicas, self._replica_timeout_ms)
        async with self._guard():
            reply, acks = await self._transport.eval_waited(self._scripts[name], keys, args, wait)
        if isinstance(reply, BaseException):
            raise reply
        return reply, _as_int(acks) if isinstance(acks, (int, bytes, str)) else 0

    def _short(self, acks: int | None, what: str) -> StateUnavailableError | None:
        """The error for a write that fewer than ``replicas`` replicas confirmed, if it was."""
        if acks is None or acks >= self._replicas:
            return None
        self.replica_shortfalls += 1
        return StateUnavailableError(
            f"{self._guard.where}: {what} on the master, but only {acks} of {self._replicas} "
            f"replicas confirmed it within replica_timeout={self._replica_timeout_ms / 1000} s"
        )

    async def _command(self, key: str, *args: str | int | bytes) -> object:
        """One command about ``key`` (``args`` include it), on the node owning it."""
        async with self._guard():
            return await self._transport.command(key, *args)

    async def _blocking_connection(self, key: str) -> AbstractConnection:
        """A connection of its own to the server owning ``key`` (``Transport.blocking_connection``),
        opened under the state's deadline and error mapping."""
        async with self._guard():
            return await self._transport.blocking_connection(key)

    async def check_durability(self) -> bool:
        """See :meth:`asynclock.state.DurabilityCheck.check_durability`: ``INFO persistence``
        of every master, once per state (``_durability.py``); a warning names a master that
        keeps no append-only file. Nothing with ``check_persistence=False``."""
        return await self._persistence.run(self._guard.where, self._each_master_info)

    async def _each_master_info(self) -> list[tuple[str, object]]:
        async with self._guard():
            return await self._transport.each_master("INFO", "persistence")

    async def _scan(self, pattern: str) -> AsyncIterator[str]:
        """Every key matching ``pattern`` (``SCAN``, on every master of a cluster); each page
        is one operation, under its own deadline."""
        pages = self._transport.scan(pattern)
        try:
            while True:
                async with self._guard():
                    page = await anext(pages, None)
                if page is None:
                    return
                for name in page:
                    yield name
        finally:
            await pages.aclose()

    # -- the State protocol -----------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire`."""
        lock_key = self.lock_key(key)
        keys = (lock_key, f"{lock_key}:abandoned:{owner}")
        process = self._process if waiting else ""
        if self._replicas:
            result, acks = await self._eval_waited("acquire", keys, owner, ttl_ms(ttl), process)
        else:
            result, acks = await self._eval("acquire", keys, owner, ttl_ms(ttl), process), None
        value = _as_int(result)
        if value > 0:
            if acks is not None:
                await self._undo_if_short(key, owner, acks)
            return Grant(value)
        return Grant(None, -value / 1000.0)

    async def _undo_if_short(self, key: str, owner: str, acks: int) -> None:
        """An acquire fewer than ``replicas`` replicas confirmed: release it and raise."""
        error = self._short(acks, f"lock {key!r} was acquired")
        if error is None:
            return
        try:
            await self.release(key, owner)
        except StateUnavailableError as exc:
            raise StateUnavailableError(
                f"{error}; releasing it failed too ({exc}): it expires with its TTL"
            ) from None
        raise StateUnavailableError(f"{error}; it was released again")

    async def fair_acquire(
        self, key: str, owner: str, ttl: float, *, turn: str, hold: float
    ) -> Grant:
        """See :meth:`asynclock.state.FairState.fair_acquire` (one EVALSHA of
        ``fair_acquire.lua``, which runs ``acquire.lua`` in turn; the line is two sorted sets
        beside the lock key, in its hash slot)."""
        lock_key = self.lock_key(key)
        keys = (lock_key, f"{lock_key}:abandoned:{owner}", *self._line_keys(lock_key))
        args = (owner, ttl_ms(ttl), "", turn, ttl_ms(check_ttl(hold, "hold", key=key)))
        if self._replicas:  # as in acquire: a grant the replicas did not confirm is undone
            result, acks = await self._eval_waited("fair_acquire", keys, *args)
        else:
            result, acks = await self._eval("fair_acquire", keys, *args), None
        value = _as_int(result)
        if value > 0:
            if acks is not None:
                await self._undo_if_short(key, owner, acks)
            return Grant(value)
        return Grant(None, -value / 1000.0)

    async def fair_leave(self, key: str, turn: str) -> None:
        """See :meth:`asynclock.state.FairState.fair_leave` (one EVALSHA)."""
        await self._eval("fair_leave", self._line_keys(self.lock_key(key)), turn)

    @staticmethod
    def _line_keys(lock_key: str) -> tuple[str, str]:
        return f"{lock_key}:line", f"{lock_key}:line:until"

    async def acquire_claimed(
        self, key: str, owner: str, ttl: float, *, claim: str, claim_ttl: float
    ) -> Grant | None:
        """See :meth:`asynclock.state.ClaimingState.acquire_claimed` (one EVALSHA)."""
        lock_key = self.lock_key(key)
        claim_key = self._prefix + claim
        if not self._keys.atomic_with(lock_key, claim_key):
            # a claim not sharing the lock's hash tag (a key starting with a brace): two steps
            if not await self._set_if_absent(claim_key, owner, claim_ttl):
                return None
            return await self.acquire(key, owner, ttl)
        keys = (lock_key, f"{lock_key}:abandoned:{owner}", claim_key)
        args = (owner, ttl_ms(ttl), "", ttl_ms(claim_ttl))
        if self._replicas:
            result, acks = await self._eval_waited("claim_acquire", keys, *args)
        else:
            result, acks = await self._eval("claim_acquire", keys, *args), None
        if result is None:
            return None
        value = _as_int(result)
        if value > 0:
            if acks is not None:
                await self._undo_if_short(key, owner, acks)
            return Grant(value)
        return Grant(None, -value / 1000.0)

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release`."""
        return await self._release(key, owner, successor, ttl)

    async def release_claimed(
        self,
        key: str,
        owner: str,
        *,
        claim: str,
        claim_ttl: float,
        successor: str | None = None,
        ttl: float | None = None,
    ) -> Release:
        """See :meth:`asynclock.state.ClaimingState.release_claimed` (one EVALSHA)."""
        claim_key = self._prefix + claim
        if not self._keys.atomic_with(self.lock_key(key), claim_key):
            await self.dedupe_keep(claim, claim_ttl)  # not under the lock's hash tag: two steps
            return await self._release(key, owner, successor, ttl)
        return await self._release(key, owner, successor, ttl, (claim_key, ttl_ms(claim_ttl)))

    async def _release(
        self,
        key: str,
        owner: str,
        successor: str | None,
        ttl: float | None,
        settle: tuple[str, int] | None = None,
    ) -> Release:
        lock_key = self.lock_key(key)
        keys: tuple[str, ...] = (lock_key, f"{lock_key}:released")
        args: tuple[str | int, ...] = (
            owner,
            successor or "",
            ttl_ms(ttl) if successor and ttl else 0,
            self._retention_ms,
            self._reservation_ms,
        )
        script = "release"
        if settle is not None:
            script = "release_claimed"
            keys, args = (*keys, settle[0]), (*args, settle[1])
        acks = None
        if successor and self._replicas:
            reply, acks = await self._eval_waited(script, keys, *args)
        else:
            reply = await self._eval(script, keys, *args)
        result = _as_int(reply)
        if result < 0:
            return Release(owned=False)
        if result and self._short(acks, f"lock {key!r} was handed to {successor!r}"):
            # not confirmed: the successor contends instead, and its acquire (idempotent for
            # the owner that holds it already) waits for the replicas itself
            return Release(owned=True, handoff_token=None)
        return Release(owned=True, handoff_token=result or None)

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.State.abandon` (``abandon.lua``)."""
        lock_key = self.lock_key(key)
        await self._eval(
            "abandon",
            (lock_key, f"{lock_key}:released", f"{lock_key}:abandoned:{owner}"),
            owner,
            # the abandoned acquire cannot be in flight for longer than an operation may take
            ttl_ms(max(self._op_timeout or 0.0, 1.0) * 2),
            self._retention_ms,
            self._reservation_ms,
            self._process,
        )

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.extend`."""
        keys = (self.lock_key(key),)
        what = f"lock {key!r} was extended"
        return await self._eval_extended("extend", keys, (owner, ttl_ms(ttl)), what)

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect`."""
        return _lock_info(key, await self._eval("inspect", (self.lock_key(key),), idempotent=True))

    async def held_locks(self, match: str = "*") -> AsyncIterator[LockInfo]:
        """See :meth:`asynclock.state.LockAdmin.held_locks` (``SCAN``, then one read per key)."""
        keys = self._keys
        for number, pattern in enumerate(keys.patterns(match)):
            async for lock_key in self._scan(pattern):
                if keys.lists(number, lock_key):
                    reply = await self._eval("inspect", (lock_key,), idempotent=True)
                    info = _lock_info(keys.key_of(lock_key), reply)
                    if info is not None:
                        yield info

    async def force_release(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.LockAdmin.force_release` (``force_release.lua``)."""
        lock_key = self.lock_key(key)
        reply = await self._eval(
            "force_release", (lock_key, f"{lock_key}:released"), self._retention_ms
        )
        return _lock_info(key, reply, held=False)

    async def dedupe_add(self, key: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.dedupe_add`."""
        return await self._set_if_absent(self._prefix + key, "1", ttl)

    async def _set_if_absent(self, name: str, value: str, ttl: float) -> bool:
        """``SET name value NX PX``: a dedupe record (its value a claim's owner, or "1")."""
        return await self._command(name, "SET", name, value, "NX", "PX", ttl_ms(ttl)) is not None

    async def dedupe_keep(self, key: str, ttl: float) -> None:
        """See :meth:`asynclock.state.State.dedupe_keep` (``dedupe_keep.lua``)."""
        await self._eval("dedupe_keep", (self._prefix + key,), ttl_ms(ttl), idempotent=True)

    async def dedupe_remaining(self, key: str) -> float | None:
        """See :meth:`asynclock.state.DedupeReading.dedupe_remaining` (``PTTL``)."""
        name = self._prefix + key
        pttl = _as_int(await self._command(name, "PTTL", name))
        # -2: no record; -1: a record without expiry (never written by asynclock): long-lived
        return None if pttl == -2 else (float("inf") if pttl < 0 else pttl / 1000)

    async def forget_claimed(self, claim: str, owner: str) -> bool:
        """See :meth:`asynclock.state.ClaimingState.forget_claimed` (``forget_claim.lua``)."""
        return _as_int(await self._eval("forget_claim", (self._prefix + claim,), owner)) > 0

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget`."""
        name = self._prefix + key
        return _as_int(await self._command(name, "DEL", name)) > 0

    @contextlib.asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.State.watch` (one shared pub/sub connection)."""
        channel = f"{self.lock_key(key)}:released".encode()
        async with self._watching(channel, EventWatch(asyncio.get_running_loop())) as watch:
            yield watch

    async def supersede(self, key: str, token: int) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede` (``supersede.lua``: a
        ``PUBLISH``, sharded on a cluster, if ``token`` still holds the key)."""
        lock_key = self.lock_key(key)
        await self._eval("supersede", (lock_key, f"{lock_key}:supersede"), int(token))

    async def supersede_carry(self, key: str, events: Sequence[str], ttl: float) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_carry` (``supersede_carry.lua``:
        a list beside the lock key, in its slot)."""
        check_key(key)
        expiry = ttl_ms(check_ttl(ttl))
        if not events:
            return
        await self._eval("supersede_carry", (f"{self.lock_key(key)}:carried",), expiry, *events)

    async def supersede_collect(self, key: str) -> list[str]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_collect`
        (``supersede_collect.lua``)."""
        check_key(key)
        reply = await self._eval("supersede_collect", (f"{self.lock_key(key)}:carried",))
        assert isinstance(reply, list)
        return [item.decode() if isinstance(item, bytes) else str(item) for item in reply]

    @contextlib.asynccontextmanager
    async def supersede_watch(self, key: str) -> AsyncIterator[TokenWatch]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_watch` (the state's pub/sub
        connection, as for :meth:`watch`)."""
        channel = f"{self.lock_key(key)}:supersede".encode()
        async with self._watching(channel, TokenWatch(asyncio.get_running_loop())) as watch:
            yield watch


def _lock_info(key: str, reply: object, *, held: bool = True) -> LockInfo | None:
    """Lock ``key``'s :class:`LockInfo` from a script's reply: ``inspect.lua``'s
    ``[owner, pttl, token]`` (``held``), ``force_release.lua``'s ``[owner, token]`` (no time
    left); ``None`` for any other reply (the key holds no lock)."""
    if not isinstance(reply, list) or len(reply) != (3 if held else 2):
        return None
    owner, token = reply[0], reply[-1]
    left = max(_as_int(reply[1]), 0) / 1000.0 if held else 0.0
    return LockInfo(key, _text(owner), left, _as_int(token))
