"""RedisState: locks and dedupe records in Redis, through redis-py's ``redis.asyncio``.

Size: over 1,000 lines, which is a debt, not a design: the plain, Sentinel and Cluster paths
still share this class through ``self._router`` checks. Splitting them into transports behind
one small interface (eval, command, scan, subscribe) is the open part of issue #18.

Every lock operation is one EVALSHA of a script in this folder (``acquire.lua``,
``release.lua``, ``extend.lua``, ``inspect.lua``, each prefixed with ``_value.lua``), so it is
atomic against every client of the server and uses the server's clock. Dedupe is one
``SET NX PX``. Key layout (``P`` is the prefix):

* ``P{key}``: the lock (see ``_value.lua`` for its value); the braces make the user's key the
  Redis Cluster hash tag, so everything about one lock lives in one slot.
* ``P{key}:released``: the lock's release channel (PUBLISH from ``release.lua``).
* ``P<namespace>:<id>``: a dedupe record.
* ``P{key}:inbox`` (and ``:attempts``, ``:tries``, ``:dead``, ``:seq``): the key's durable inbox
  (``:tries``: the attempt counts of the entries ``inbox_take`` handed out); the set of
  keys with work and the wake-up channel are the ready index's (``_ready.py``: one set on one
  server; one per slot and a directory on a cluster, ``_cluster_inbox.py``).

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
import hashlib
import json
from importlib import resources
from typing import TYPE_CHECKING, cast
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis, RedisCluster
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.retry import Retry

from asynclock._compat import deadline_after
from asynclock._errors import LockNotOwnedError, StateUnavailableError
from asynclock._owner import new_process_id
from asynclock._validate import check_key, check_limit, check_seconds, check_ttl, ttl_ms
from asynclock.state._base import ClosesOnExit
from asynclock.state._errors import map_driver_errors, unavailable_error
from asynclock.state._protocol import (
    DeadLetter,
    Grant,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxKey,
    LockInfo,
    Release,
)
from asynclock.state._url import StateURL, redact
from asynclock.state._watch import EventWatch
from asynclock.state.redis._cluster import ClusterRouter, slot_of, startup_nodes
from asynclock.state.redis._cluster_inbox import SlotReadySets
from asynclock.state.redis._pool import LeanPool
from asynclock.state.redis._ready import ReadyIndex, ReadySet
from asynclock.state.redis._sentinel import SentinelMaster, parse_sentinel_url
from asynclock.state.redis._subscriber import ShardedSubscriber, Subscriber

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection

    from redis.asyncio.connection import AbstractConnection

__all__ = ["RedisState"]

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    OSError,
    # a cluster that lost a master (or has no node answering) cannot serve the key right now
    redis_errors.ClusterDownError,
    redis_errors.SlotNotCoveredError,
)
_UNAVAILABLE_OR_TIMEOUT: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    TimeoutError,
    asyncio.TimeoutError,
)


class _Script:
    """Lua files of this folder joined into one script (the prelude first), run by EVALSHA."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str, *parts: str, sharded: bool = False) -> None:
        folder = resources.files(__package__)
        self.name = name
        self.text = "\n".join(
            folder.joinpath(f"{part}.lua").read_text(encoding="utf-8")
            for part in ("_value", *(parts or (name,)))
        )
        if sharded:
            # Redis Cluster: a plain PUBLISH is broadcast to every node of the cluster; a sharded
            # one stays on the node owning the channel's slot, where its waiters SSUBSCRIBE.
            self.text = self.text.replace("redis.call('PUBLISH',", "redis.call('SPUBLISH',")
        self.sha = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()


def _scripts(*, sharded: bool = False) -> dict[str, _Script]:
    names = (
        "acquire",
        "release",
        "extend",
        "inspect",
        "abandon",
        "force_release",
        "dedupe_keep",
        "forget_claim",
    )
    scripts = {name: _Script(name, sharded=sharded) for name in names}
    scripts["claim_acquire"] = _Script("claim_acquire", "_claim", "acquire", sharded=sharded)
    scripts["release_claimed"] = _Script("release_claimed", "_settle", "release", sharded=sharded)
    # the inbox wake-up stays a PUBLISH on a cluster too (see _cluster_inbox.py): the prelude
    # that says whether the key may be added to its set of keys with work goes first
    scripts["inbox_accept"] = _Script("inbox_accept", "_listed", "inbox_accept")
    scripts["inbox_requeue"] = _Script("inbox_requeue", "_listed", "inbox_requeue")
    scripts["inbox_step"] = _Script("inbox_step", "_inbox_step", "release", sharded=sharded)
    scripts["inbox_take"] = _Script("inbox_take", "_inbox_take", "release", sharded=sharded)
    scripts["inbox_unlist"] = _Script("inbox_unlist")
    scripts["inbox_forget_slot"] = _Script("inbox_forget_slot")
    scripts["fair_acquire"] = _Script(
        "fair_acquire", "_fair_open", "acquire", "fair_acquire", sharded=sharded
    )
    scripts["fair_leave"] = _Script("fair_leave", sharded=sharded)
    return scripts


def _check_connection_options(url: str, pool: BlockingConnectionPool) -> None:
    """Reject what redis-py would only fail on at the first command: an unknown ``?option``
    (a TypeError from the connection class) or a database that is not a number >= 0."""
    kwargs = pool.connection_kwargs
    try:
        pool.connection_class(**kwargs)  # no I/O: only checks the keywords
    except TypeError as exc:
        raise ValueError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
    path = urlsplit(url).path.strip("/") if StateURL(url).scheme != "unix" else ""
    db = kwargs.get("db", 0)
    if (path and not path.isdigit()) or not isinstance(db, int) or db < 0:
        raise ValueError(
            f"invalid Redis URL {redact(url)!r}: the database must be a number >= 0, "
            f"got {path or db!r}"
        )


class RedisState(ClosesOnExit):
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
        self._where = (
            f"Redis Cluster at {_describe(client)}"
            if isinstance(client, RedisCluster)
            else f"Redis at {_describe(client)}"
        )
        self._process = new_process_id()
        self._subscriber: Subscriber | ShardedSubscriber | None = None
        self._router: ClusterRouter | None = None
        self._sentinel: SentinelMaster | None = None
        self._pool: LeanPool | SentinelMaster
        # where the inbox's keys with work are kept: one set, or one per slot on a cluster
        self._ready: ReadyIndex = ReadySet(prefix, self._command)
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
        #: acquires, extends and handoffs that fewer than ``replicas`` replicas confirmed
        self.replica_shortfalls = 0
        if replicas and isinstance(client, RedisCluster):
            raise ValueError("replicas=N is not supported on Redis Cluster")
        if isinstance(client, RedisCluster):
            size = client.connection_kwargs.get("max_connections")
            self._router = ClusterRouter(client, _pool_size(size))
            self._scripts = _scripts(sharded=True)
            self._ready = SlotReadySets(
                self._router,
                prefix,
                self._guard,
                unlist=self._scripts["inbox_unlist"],
                forget=self._scripts["inbox_forget_slot"],
                op_timeout=self._op_timeout or 5.0,
            )
            # unused on a cluster: every command goes through the router's per-master pools
            self._pool = LeanPool(_no_connection, 1)
        elif isinstance(client.connection_pool, SentinelConnectionPool):
            self._scripts = _scripts()
            size = getattr(client.connection_pool, "max_connections", None)
            self._sentinel = SentinelMaster(
                client.connection_pool, _pool_size(size), self._op_timeout or 5.0
            )
            self._pool = self._sentinel
            self._where = f"Redis Sentinel service {self._sentinel.service!r}"
        elif isinstance(client, Redis):  # (redis-py 5.x's stubs do not narrow the else branch)
            self._scripts = _scripts()
            size = getattr(client.connection_pool, "max_connections", None)
            plain = client
            self._pool = LeanPool(lambda: _connection_for(plain), _pool_size(size))
        else:
            raise TypeError(
                f"client must be a redis.asyncio Redis or RedisCluster, got {type(client).__name__}"
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
        parsed = StateURL(url)
        check_seconds(connect_timeout, "connect_timeout")
        op = check_seconds(op_timeout, "op_timeout")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        client: Redis | RedisCluster
        if parsed.scheme == "redis+sentinel":
            client, where = cls._sentinel_client(url, connect_timeout, max_connections)
        elif parsed.scheme == "redis+cluster":
            if replicas:
                raise ValueError("replicas=N is not supported on Redis Cluster")
            client, where = cls._cluster_client(url, connect_timeout, max_connections)
        else:
            client, where = cls._plain_client(url, connect_timeout, op, max_connections)
        state = cls(
            client,
            prefix=prefix,
            op_timeout=op_timeout,
            token_retention=token_retention,
            reservation=reservation,
            replicas=replicas,
            replica_timeout=replica_timeout,
        )
        state._owns_client = True
        state._where = where
        return state

    @staticmethod
    def _plain_client(
        url: str, connect_timeout: float, op: float | None, max_connections: int
    ) -> tuple[Redis, str]:
        """A client for ``redis://``, ``rediss://`` or ``unix://``, and where it points."""
        try:
            pool = BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=op,
                socket_connect_timeout=connect_timeout,
                socket_timeout=None,
                retry=_no_retries(),
            )
        except ValueError as exc:
            raise ValueError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
        _check_connection_options(url, pool)
        return Redis(connection_pool=pool), f"Redis at {redact(url)}"

    @staticmethod
    def _sentinel_client(
        url: str, connect_timeout: float, max_connections: int
    ) -> tuple[Redis, str]:
        """``redis+sentinel://[[user]:password@]host:port[,host:port...]/service[/db][?options]``.

        The host:port pairs are sentinels; the credentials, database and options are the
        master's, except ``sentinel_username`` and ``sentinel_password`` (the sentinels' own
        AUTH). Nothing connects before the first operation.
        """
        try:
            sentinels, service, data_url, _ = parse_sentinel_url(url)
            pool = BlockingConnectionPool.from_url(data_url)
        except ValueError as exc:
            raise ValueError(f"invalid Redis Sentinel URL {redact(url)!r}: {exc}") from None
        kwargs = dict(pool.connection_kwargs)
        for name in ("host", "port"):
            kwargs.pop(name, None)
        sentinel_kwargs: dict[str, object] = {
            "socket_connect_timeout": connect_timeout,
            "socket_timeout": connect_timeout,
            "retry": _no_retries(),
        }
        for name in ("sentinel_username", "sentinel_password"):
            value = kwargs.pop(name, None)
            if value is not None:
                sentinel_kwargs[name.removeprefix("sentinel_")] = value
        kwargs.pop("connection_class", None)
        try:
            pool.connection_class(**kwargs)  # no I/O: only checks the keywords
        except TypeError as exc:
            raise ValueError(f"invalid Redis Sentinel URL {redact(url)!r}: {exc}") from None
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            sentinels,
            sentinel_kwargs=sentinel_kwargs,
            **{**kwargs, "socket_connect_timeout": connect_timeout, "socket_timeout": None},
        )
        client = sentinel.master_for(service, max_connections=max_connections)
        return client, f"Redis Sentinel service {service!r} at {redact(url)}"

    @staticmethod
    def _cluster_client(
        url: str, connect_timeout: float, max_connections: int
    ) -> tuple[RedisCluster, str]:
        """``redis+cluster://[user:password@]host:port[,host:port...]``: any node(s) of the cluster.

        ``max_connections`` is per master. Nothing connects before the first operation.
        """
        rest = url.partition("://")[2]
        userinfo, _, hosts = rest.rpartition("@")
        hosts, _, query = hosts.partition("?")
        hosts = hosts.split("/", 1)[0]
        nodes = [part.strip() for part in hosts.split(",") if part.strip()]
        if not nodes:
            raise ValueError(f"invalid Redis Cluster URL {redact(url)!r}: no host:port")
        first = f"redis://{userinfo + '@' if userinfo else ''}{nodes[0]}"
        try:
            from redis.asyncio.cluster import ClusterNode

            startup = []
            for node in nodes:
                host, sep, port = node.rpartition(":")
                if not sep:
                    host, port = node, "6379"
                startup.append(ClusterNode(host.strip("[]") or "127.0.0.1", int(port)))
            client = RedisCluster.from_url(
                first + (f"?{query}" if query else ""),
                startup_nodes=startup[1:],
                max_connections=max_connections,
                socket_connect_timeout=connect_timeout,
                socket_timeout=None,
                retry=_no_retries(),
            )
        except (ValueError, redis_errors.RedisClusterException) as exc:
            raise ValueError(f"invalid Redis Cluster URL {redact(url)!r}: {exc}") from None
        return client, f"Redis Cluster at {redact(url)}"

    def __repr__(self) -> str:
        if self._sentinel is not None:
            return f"RedisState({self._where}, prefix={self._prefix!r})"
        if self._router is not None:
            where = self._where.removeprefix("Redis Cluster at ")
            return f"RedisState(cluster {where}, prefix={self._prefix!r})"
        return f"RedisState({self._where.removeprefix('Redis at ')}, prefix={self._prefix!r})"

    async def aclose(self) -> None:
        """Close the subscriber, and the client when this state built it."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            await subscriber.aclose()
        await self._ready.aclose()
        if self._sentinel is not None:
            await self._sentinel.aclose(sentinels=self._owns_client)
        else:
            await self._pool.aclose()
        if self._router is not None:
            await self._router.aclose()
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
        return self._router is not None

    @property
    def master(self) -> tuple[str, int] | None:
        """Under Redis Sentinel: the master's address as last named by the sentinels."""
        return self._sentinel.address if self._sentinel is not None else None

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
        keeps the tag non-empty and the layout one-to-one (see :meth:`_key_of`).
        """
        if self._router is not None and key[:1] in ("{", "}"):
            return f"{self._prefix}{{{{{key}}}"
        return f"{self._prefix}{{{key}}}"

    def _key_of(self, lock_key: str) -> str:
        """The lock key's ``key`` (the inverse of :meth:`lock_key`)."""
        body = lock_key[len(self._prefix) + 1 : -1]
        if self._router is not None and body.startswith("{"):
            return body[1:]
        return body

    # -- plumbing ---------------------------------------------------------------------------

    async def _eval(
        self, name: str, keys: tuple[str, ...], *args: str | int, idempotent: bool = False
    ) -> object:
        script = self._scripts[name]
        if self._router is not None:
            return await self._eval_clustered(script, keys, args, idempotent=idempotent)
        call = self._pool.call
        try:
            async with deadline_after(self._op_timeout):
                try:
                    return await call(
                        "EVALSHA", script.sha, len(keys), *keys, *args, retry_stale=idempotent
                    )
                except redis_errors.NoScriptError:
                    await call("SCRIPT", "LOAD", script.text)
                    return await call("EVALSHA", script.sha, len(keys), *keys, *args)
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc

    async def _eval_waited(
        self, name: str, keys: tuple[str, ...], *args: str | int
    ) -> tuple[object, int | None]:
        """:meth:`_eval`, then ``WAIT replicas replica_timeout`` in the same write on the same
        connection (WAIT counts the replicas that have this connection's writes). Returns the
        script's reply and the replicas that confirmed (``None`` when ``replicas`` is 0)."""
        script = self._scripts[name]
        pool = self._pool
        wait = ("WAIT", self._replicas, self._replica_timeout_ms)
        try:
            async with deadline_after(self._op_timeout):
                command = ("EVALSHA", script.sha, len(keys), *keys, *args)
                reply, acks = await pool.call_pair(command, wait)
                if isinstance(reply, redis_errors.NoScriptError):
                    await pool.call("SCRIPT", "LOAD", script.text)
                    reply, acks = await pool.call_pair(command, wait)
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc
        if isinstance(reply, BaseException):
            raise reply
        return reply, _as_int(acks) if isinstance(acks, (int, bytes, str)) else 0

    def _short(self, acks: int | None, what: str) -> StateUnavailableError | None:
        """The error for a write that fewer than ``replicas`` replicas confirmed, if it was."""
        if acks is None or acks >= self._replicas:
            return None
        self.replica_shortfalls += 1
        return StateUnavailableError(
            f"{self._where}: {what} on the master, but only {acks} of {self._replicas} "
            f"replicas confirmed it within replica_timeout={self._replica_timeout_ms / 1000} s"
        )

    async def _eval_clustered(
        self,
        script: _Script,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        *,
        idempotent: bool,
    ) -> object:
        router = self._router
        assert router is not None
        try:
            async with deadline_after(self._op_timeout):
                return await router.call(
                    slot_of(keys[0]),
                    "EVALSHA",
                    script.sha,
                    len(keys),
                    *keys,
                    *args,
                    retry_stale=idempotent,
                    script=script.text,
                )
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc

    async def _command(self, key: str, *args: str | int | bytes) -> object:
        """One command about ``key`` (``args`` include it), on the node owning it."""
        try:
            async with deadline_after(self._op_timeout):
                if self._router is not None:
                    return await self._router.call(slot_of(key), *args)
                return await self._pool.call(*args)
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc

    async def _scan(self, pattern: str) -> AsyncIterator[str]:
        """Every key matching ``pattern`` (``SCAN``, on every master of a cluster)."""
        if self._router is None:
            nodes: list[object] = [None]
        else:
            try:
                async with deadline_after(self._op_timeout):
                    await self._router.refresh()
            except _UNAVAILABLE_OR_TIMEOUT as exc:
                raise self._unavailable(exc) from exc
            nodes = list(self._router.masters)
        for node in nodes:
            cursor: bytes | int = 0
            while True:
                args = ("SCAN", cursor, "MATCH", pattern, "COUNT", 500)
                try:
                    async with deadline_after(self._op_timeout):
                        if self._router is not None and isinstance(node, tuple):
                            reply = await self._router.call_on(node, *args)
                        else:
                            reply = await self._pool.call(*args)
                except _UNAVAILABLE_OR_TIMEOUT as exc:
                    raise self._unavailable(exc) from exc
                assert isinstance(reply, list)
                cursor, keys = reply
                for raw in keys:
                    yield raw.decode() if isinstance(raw, bytes) else str(raw)
                if _as_int(cursor) == 0:
                    break

    @contextlib.asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        """One operation: its ``op_timeout`` deadline, its driver errors StateUnavailableError."""
        with map_driver_errors(_UNAVAILABLE, self._where, self._op_timeout):
            async with deadline_after(self._op_timeout):
                yield

    def _unavailable(self, exc: BaseException) -> StateUnavailableError:
        return unavailable_error(exc, self._where, self._op_timeout)

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
        if self._router is not None and slot_of(claim_key) != slot_of(lock_key):
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
        if self._router is not None and slot_of(claim_key) != slot_of(self.lock_key(key)):
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
        if not self._replicas:
            reply = await self._eval("extend", keys, owner, ttl_ms(ttl), idempotent=True)
            return _as_int(reply) == 1
        reply, acks = await self._eval_waited("extend", keys, owner, ttl_ms(ttl))
        if _as_int(reply) != 1:
            return False
        error = self._short(acks, f"lock {key!r} was extended")
        if error is not None:
            raise error
        return True

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect`."""
        result = await self._eval("inspect", (self.lock_key(key),), idempotent=True)
        if not isinstance(result, list) or len(result) != 3:
            return None
        owner, pttl, token = result
        owner_text = owner.decode() if isinstance(owner, bytes) else str(owner)
        return LockInfo(key, owner_text, max(_as_int(pttl), 0) / 1000.0, _as_int(token))

    async def held_locks(self, match: str = "*") -> AsyncIterator[LockInfo]:
        """See :meth:`asynclock.state.LockAdmin.held_locks` (``SCAN``, then one read per key)."""
        patterns = [f"{_glob_escape(self._prefix)}{{{match}}}"]
        if self._router is not None:  # keys starting with a brace (see lock_key)
            patterns.append(f"{_glob_escape(self._prefix)}{{{{{match}}}")
        for number, pattern in enumerate(patterns):
            async for lock_key in self._scan(pattern):
                if (
                    number == 0
                    and self._router is not None
                    and lock_key[len(self._prefix) + 1 :].startswith("{")
                ):
                    continue  # listed by the second pattern, where it matches
                info = await self._eval("inspect", (lock_key,), idempotent=True)
                if isinstance(info, list) and len(info) == 3:
                    owner, pttl, token = info
                    yield LockInfo(
                        self._key_of(lock_key),
                        owner.decode() if isinstance(owner, bytes) else str(owner),
                        max(_as_int(pttl), 0) / 1000.0,
                        _as_int(token),
                    )

    async def force_release(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.LockAdmin.force_release` (``force_release.lua``)."""
        lock_key = self.lock_key(key)
        reply = await self._eval(
            "force_release", (lock_key, f"{lock_key}:released"), self._retention_ms
        )
        if not isinstance(reply, list) or len(reply) != 2:
            return None
        owner, token = reply
        owner_text = owner.decode() if isinstance(owner, bytes) else str(owner)
        return LockInfo(key, owner_text, 0.0, _as_int(token))

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
        async with self._watch_channel(f"{self.lock_key(key)}:released".encode()) as watch:
            yield watch

    @contextlib.asynccontextmanager
    async def _watch_channel(
        self, channel: bytes, subscriber: Subscriber | ShardedSubscriber | None = None
    ) -> AsyncIterator[EventWatch]:
        """A watch woken by every message on ``channel``, on ``subscriber`` (by default the
        state's own pub/sub connection)."""
        if subscriber is None and self._subscriber is None:
            if self._router is not None:
                self._subscriber = ShardedSubscriber(self._router, self._op_timeout or 5.0)
            elif self._sentinel is not None:
                master = self._sentinel
                self._subscriber = Subscriber(
                    lambda: master.new_connection(protocol=2),
                    self._op_timeout or 5.0,
                    locate=master.locate,
                )
            else:
                client = self._client
                assert isinstance(client, Redis)
                self._subscriber = Subscriber(
                    lambda: _subscriber_connection(client), self._op_timeout or 5.0
                )
        subscriber = subscriber or self._subscriber
        assert subscriber is not None
        watch = EventWatch(asyncio.get_running_loop())
        with map_driver_errors(_UNAVAILABLE, self._where, self._op_timeout):
            await subscriber.add(channel, watch)
        try:
            yield watch
        finally:
            subscriber.discard(channel, watch)

    # -- the inbox (InboxState) -------------------------------------------------------------

    def _inbox_keys(self, key: str) -> tuple[str, str, str, str]:
        """The inbox's list, head attempt count, dead letters and entry counter (one slot)."""
        base = f"{self.lock_key(key)}:inbox"
        return base, f"{base}:attempts", f"{base}:dead", f"{base}:seq"

    async def inbox_accept(
        self, key: str, payload: str, *, claim: str | None, claim_ttl: float, max_pending: int
    ) -> InboxAccepted:
        """See :meth:`asynclock.state.InboxState.inbox_accept` (``inbox_accept.lua``, one EVALSHA;
        with ``replicas=``, WAIT in the same write; on a cluster, two more the first time a slot
        gets work: see ``_cluster_inbox.py``)."""
        check_key(key)
        entries, _, _, seq = self._inbox_keys(key)
        lock_key = self.lock_key(key)
        claim_key = self._prefix + claim if claim is not None else seq
        if not self._ready.atomic_with(lock_key, claim_key):
            return await self._accept_claimed_apart(key, payload, claim_key, claim_ttl, max_pending)
        ready, mark = self._ready.ready_key(lock_key), self._ready.listed_key(lock_key)
        reply = await self._eval_listing(
            "inbox_accept",
            lock_key,
            (entries, seq, ready, claim_key, mark),
            (payload, max_pending, ttl_ms(claim_ttl), key, "1" if claim is not None else "0"),
            lambda reply: isinstance(reply, list) and _text(reply[0]) == "unlisted",
            f"an event for {key!r} was accepted",
        )
        assert isinstance(reply, list)
        return InboxAccepted(_text(reply[0]), _as_int(reply[1]))

    async def _accept_claimed_apart(
        self, key: str, payload: str, claim_key: str, claim_ttl: float, max_pending: int
    ) -> InboxAccepted:
        """A claim that no script can reach with the inbox (a cluster key starting with a brace,
        see :meth:`lock_key`): record it first, then accept without it, and forget it again if
        the entry was not appended. Two round trips; a crash between them loses the event's
        redelivery as a duplicate, as :meth:`acquire_claimed` does for such keys."""
        if not await self._set_if_absent(claim_key, "accepted", claim_ttl):
            entries = self._inbox_keys(key)[0]
            return InboxAccepted(
                "duplicate", _as_int(await self._command(entries, "LLEN", entries))
            )
        accepted = await self.inbox_accept(
            key, payload, claim=None, claim_ttl=claim_ttl, max_pending=max_pending
        )
        if accepted.status != "accepted":
            await self._command(claim_key, "DEL", claim_key)
        return accepted

    async def _eval_listing(
        self,
        name: str,
        lock_key: str,
        keys: tuple[str, ...],
        args: tuple[str | int, ...],
        unlisted: Callable[[object], bool],
        what: str,
    ) -> object:
        """Run a script that may add ``lock_key``'s key to its set of keys with work
        (``_listed.lua``); if that set was ``unlisted``, list it and run the script again.

        The script gets ``args``, then the listing, then the wake-up channel. With
        ``replicas=N``, each run is confirmed by WAIT (a shortfall raises, naming ``what``).
        """
        channel = self._ready.channel
        reply = await self._eval_confirmed(name, keys, (*args, self._ready.listing, channel), what)
        if unlisted(reply):  # a run with a generation is never unlisted (_listed.lua)
            generation = await self._ready.list_for(lock_key)
            reply = await self._eval_confirmed(name, keys, (*args, generation, channel), what)
        return reply

    async def _eval_confirmed(
        self, name: str, keys: tuple[str, ...], args: tuple[str | int, ...], what: str
    ) -> object:
        """:meth:`_eval`; with ``replicas=N``, :meth:`_eval_waited`, a shortfall raising."""
        if not self._replicas:
            return await self._eval(name, keys, *args)
        reply, acks = await self._eval_waited(name, keys, *args)
        error = self._short(acks, what)
        if error is not None:
            raise error
        return reply

    async def inbox_step(
        self,
        key: str,
        owner: str,
        *,
        done: int | None = None,
        dead: str | None = None,
        take: bool = True,
    ) -> InboxEntry | None:
        """See :meth:`asynclock.state.InboxState.inbox_step` (``_inbox_step.lua`` before
        ``release.lua``: one EVALSHA)."""
        args = (
            *self._step_args(owner),
            "" if done is None else str(done),
            "1" if dead is not None else "0",
            dead or "",
            "1" if take else "0",
            key,
        )
        reply = await self._eval("inbox_step", self._step_keys(key), *args)
        if isinstance(reply, list):
            head, count, now_ms, pending = reply
            entry_id, accepted_ms, payload = _entry(head)
            age = max(_as_int(now_ms) - accepted_ms, 0) / 1000.0
            return InboxEntry(entry_id, _as_int(count), payload, age, _as_int(pending))
        if _as_int(reply) < 0:
            raise LockNotOwnedError(key, owner)
        return None

    async def inbox_take(
        self,
        key: str,
        owner: str,
        *,
        done: Collection[int] = (),
        dead: str | None = None,
        limit: int,
    ) -> InboxBatch | None:
        """See :meth:`asynclock.state.InboxState.inbox_take` (``_inbox_take.lua`` before
        ``release.lua``: one EVALSHA)."""
        check_limit(limit)
        ids = tuple(str(int(entry)) for entry in done)
        args = (*self._step_args(owner), limit, "1" if dead is not None else "0", dead or "", key)
        keys = (*self._step_keys(key), f"{self._inbox_keys(key)[0]}:tries")
        reply = await self._eval("inbox_take", keys, *args, *ids)
        if not isinstance(reply, list):
            if _as_int(reply) < 0:
                raise LockNotOwnedError(key, owner)
            return None
        now_ms, pending, newest, *handed = reply
        now, count = _as_int(now_ms), _as_int(pending)
        entries = []
        for raw, attempts in zip(handed[::2], handed[1::2], strict=True):
            entry_id, accepted_ms, payload = _entry(raw)
            age = max(now - accepted_ms, 0) / 1000.0
            entries.append(InboxEntry(entry_id, _as_int(attempts), payload, age, count))
        quiet = max(now - _entry(newest)[1], 0) / 1000.0
        return InboxBatch(tuple(entries), count, quiet)

    def _step_keys(self, key: str) -> tuple[str, ...]:
        """KEYS[1..7] of ``inbox_step`` and ``inbox_take`` (release.lua's, then the inbox's)."""
        entries, attempts, dead_letters, seq = self._inbox_keys(key)
        lock_key = self.lock_key(key)
        return (
            lock_key,
            f"{lock_key}:released",
            entries,
            attempts,
            dead_letters,
            self._ready.ready_key(lock_key),
            seq,
        )

    def _step_args(self, owner: str) -> tuple[str | int, ...]:
        """ARGV[1..5] of ``inbox_step`` and ``inbox_take``: release.lua's, without a successor."""
        return (owner, "", 0, self._retention_ms, self._reservation_ms)

    async def inbox_ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready` (one ZRANGE; on a cluster, the
        directory and the sets it lists, see ``_cluster_inbox.py``)."""
        return await self._ready.keys()

    @contextlib.asynccontextmanager
    async def inbox_watch(self) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.InboxState.inbox_watch` (SUBSCRIBE to the wake-up channel)."""
        channel = self._ready.channel.encode()
        async with self._watch_channel(channel, self._ready.wake_subscriber()) as watch:
            yield watch

    async def inbox_keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys` (the set of keys with work, and a
        SCAN for dead letters)."""
        keys = set(await self.inbox_ready())
        pattern = f"{_glob_escape(self._prefix)}{{*}}:inbox:dead"
        async for name in self._scan(pattern):
            keys.add(self._key_of(name[: -len(":inbox:dead")]))
        found = []
        now = await self._command(self._ready.channel, "TIME")  # the server's clock, once
        assert isinstance(now, list)
        now_ms = _as_int(now[0]) * 1000 + _as_int(now[1]) // 1000
        for key in sorted(keys):
            entries, _, dead_letters, _ = self._inbox_keys(key)
            pending = _as_int(await self._command(entries, "LLEN", entries))
            head = await self._command(entries, "LINDEX", entries, 0)
            age = 0.0 if head is None else max(now_ms - _entry(head)[1], 0) / 1000.0
            dead = _as_int(await self._command(dead_letters, "LLEN", dead_letters))
            found.append(InboxKey(key, pending, age, dead))
        return found

    async def inbox_dead_letters(self, key: str) -> list[DeadLetter]:
        """See :meth:`asynclock.state.InboxState.inbox_dead_letters` (one LRANGE)."""
        _, _, dead_letters, _ = self._inbox_keys(key)
        reply = await self._command(dead_letters, "LRANGE", dead_letters, 0, -1)
        assert isinstance(reply, list)
        letters = []
        for raw in reply:
            entry, attempts, error = json.loads(_text(raw))
            entry_id, _, payload = _entry(entry)
            letters.append(DeadLetter(key, entry_id, int(attempts), error, payload))
        return letters

    async def inbox_requeue(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_requeue` (``inbox_requeue.lua``)."""
        entries, attempts, dead_letters, _ = self._inbox_keys(key)
        lock_key = self.lock_key(key)
        ready, mark = self._ready.ready_key(lock_key), self._ready.listed_key(lock_key)
        reply = await self._eval_listing(
            "inbox_requeue",
            lock_key,
            (entries, attempts, dead_letters, ready, mark),
            (key,),
            lambda reply: _as_int(reply) < 0,
            f"dead letters of {key!r} were requeued",
        )
        return _as_int(reply)


def _glob_escape(text: str) -> str:
    """Escape Redis glob characters so ``text`` matches only itself."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _as_int(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, (bytes, str)):
        return int(value)
    raise TypeError(f"unexpected reply from Redis: {value!r}")


def _connection_for(client: Redis) -> AbstractConnection:
    """A new connection configured like ``client``'s, minus the per-read socket timeout.

    Every operation runs under RedisState's own ``op_timeout`` deadline instead, and a reply is
    read whole or the connection is dropped, so a per-read timeout adds cost and nothing else.
    """
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = None
    conn: AbstractConnection = pool.connection_class(**kwargs)
    return conn


def _subscriber_connection(client: Redis) -> AbstractConnection:
    """A new pub/sub connection like ``client``'s: no read timeout (it blocks on reads by
    design), RESP2 (pub/sub arrays)."""
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs["socket_timeout"] = None
    kwargs["protocol"] = 2
    conn: AbstractConnection = pool.connection_class(**kwargs)
    return conn


def _no_retries() -> Retry:
    """redis-py's own retries off: RedisState bounds every operation with its own deadline."""
    # redis-py 5.0 leaves Retry and NoBackoff unannotated; called through Callable types the
    # calls are typed on every version of the declared range
    make_retry = cast("Callable[[object, int], Retry]", Retry)
    make_backoff = cast("Callable[[], object]", NoBackoff)
    return make_retry(make_backoff(), 0)


def _no_connection() -> AbstractConnection:
    raise RuntimeError("a clustered RedisState sends every command through its router")


def _pool_size(size: object) -> int:
    return size if isinstance(size, int) and 0 < size < 2**31 else 50


def _describe(client: Redis | RedisCluster) -> str:
    if isinstance(client, RedisCluster):
        return ",".join(node.name for node in startup_nodes(client))
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry(raw: object) -> tuple[int, int, str]:
    """An inbox entry ``"<id> <accepted ms> <payload>"`` (``inbox_accept.lua``) as its parts."""
    entry_id, accepted_ms, payload = _text(raw).split(" ", 2)
    return int(entry_id), int(accepted_ms), payload
