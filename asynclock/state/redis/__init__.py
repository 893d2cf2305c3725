"""RedisState: locks and dedupe records in Redis, through redis-py's ``redis.asyncio``.

Every lock operation is one EVALSHA of a script in this folder (``acquire.lua``,
``release.lua``, ``extend.lua``, ``inspect.lua``, each prefixed with ``_value.lua``), so it is
atomic against every client of the server and uses the server's clock. Dedupe is one
``SET NX PX``. Key layout (``P`` is the prefix):

* ``P{key}``: the lock (see ``_value.lua`` for its value); the braces make the user's key the
  Redis Cluster hash tag, so everything about one lock lives in one slot.
* ``P{key}:released``: the lock's release channel (PUBLISH from ``release.lua``).
* ``P<namespace>:<id>``: a dedupe record.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from redis import exceptions as redis_errors
from redis.asyncio import BlockingConnectionPool, Redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from asynclock._compat import deadline_after
from asynclock._owner import new_process_id
from asynclock._validate import check_seconds, check_ttl, ttl_ms
from asynclock.state._base import ClosesOnExit
from asynclock.state._errors import map_driver_errors, unavailable_error
from asynclock.state._protocol import Grant, LockInfo, Release
from asynclock.state._url import StateURL, redact
from asynclock.state._watch import EventWatch
from asynclock.state.redis._pool import LeanPool
from asynclock.state.redis._subscriber import Subscriber

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from redis.asyncio.connection import AbstractConnection

    from asynclock._errors import StateUnavailableError

__all__ = ["RedisState"]

_UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    OSError,
)
_UNAVAILABLE_OR_TIMEOUT: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    TimeoutError,
    asyncio.TimeoutError,
)


class _Script:
    """Lua files of this folder joined into one script (the prelude first), run by EVALSHA."""

    __slots__ = ("name", "sha", "text")

    def __init__(self, name: str, *parts: str) -> None:
        folder = resources.files(__package__)
        self.name = name
        self.text = "\n".join(
            folder.joinpath(f"{part}.lua").read_text(encoding="utf-8")
            for part in ("_value", *(parts or (name,)))
        )
        self.sha = hashlib.sha1(self.text.encode(), usedforsecurity=False).hexdigest()


def _scripts() -> dict[str, _Script]:
    scripts = {
        name: _Script(name) for name in ("acquire", "release", "extend", "inspect", "abandon")
    }
    scripts["claim_acquire"] = _Script("claim_acquire", "_claim", "acquire")
    scripts["force_release"] = _Script("force_release")
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

    Args:
        client: a ``redis.asyncio.Redis`` client. RESP2 or RESP3 both work.
        prefix: put in front of every key, so applications sharing a server never meet.
            Must not contain ``{`` or ``}`` (they would change the Cluster hash tag).
        op_timeout: seconds one operation may take, connection wait included.
        token_retention: seconds a released key remembers its last fencing token.
        reservation: seconds a release keeps the lock reserved for a waiter of another process
            that asked for a turn, before anyone may take it.
    """

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "asynclock:",
        op_timeout: float = 5.0,
        token_retention: float = 60.0,
        reservation: float = 0.25,
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
        self._where = f"Redis at {_describe(client)}"
        self._process = new_process_id()
        self._scripts = _scripts()
        self._subscriber: Subscriber | None = None
        pool = client.connection_pool
        size = getattr(pool, "max_connections", None)
        self._pool = LeanPool(
            lambda: _connection_for(client), size if isinstance(size, int) and size < 2**31 else 50
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
    ) -> RedisState:
        """Build a state (and its own client) from a ``redis://``, ``rediss://`` or ``unix://`` URL.

        The client uses a blocking pool of ``max_connections``: a burst of concurrent operations
        waits for a free connection (within ``op_timeout``) instead of failing with
        "Too many connections". It has no per-read socket timeout and no automatic retries: each
        operation runs under one ``op_timeout`` deadline instead (cheaper than redis-py's
        per-command ``wait_for``), and a retried release could report a lock it had just released
        as lost.
        """
        parsed = StateURL(url)
        if parsed.scheme == "redis+cluster":
            raise NotImplementedError(
                "redis+cluster:// is planned (issue #8); use redis:// for a single server"
            )
        check_seconds(connect_timeout, "connect_timeout")
        op = check_seconds(op_timeout, "op_timeout")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        try:
            pool = BlockingConnectionPool.from_url(
                url,
                max_connections=max_connections,
                timeout=op,
                socket_connect_timeout=connect_timeout,
                socket_timeout=None,
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:
            raise ValueError(f"invalid Redis URL {redact(url)!r}: {exc}") from None
        _check_connection_options(url, pool)
        client = Redis(connection_pool=pool)
        state = cls(
            client,
            prefix=prefix,
            op_timeout=op_timeout,
            token_retention=token_retention,
            reservation=reservation,
        )
        state._owns_client = True
        state._where = f"Redis at {redact(url)}"
        return state

    def __repr__(self) -> str:
        return f"RedisState({self._where.removeprefix('Redis at ')}, prefix={self._prefix!r})"

    async def aclose(self) -> None:
        """Close the subscriber, and the client when this state built it."""
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is not None:
            await subscriber.aclose()
        await self._pool.aclose()
        if self._owns_client:
            await self._client.aclose()
        else:
            await asyncio.sleep(0)

    @property
    def client(self) -> Redis:
        """The redis-py client this state talks through."""
        return self._client

    @property
    def prefix(self) -> str:
        """The prefix of every key this state writes."""
        return self._prefix

    def lock_key(self, key: str) -> str:
        """The Redis key that holds lock ``key``."""
        return f"{self._prefix}{{{key}}}"

    # -- plumbing ---------------------------------------------------------------------------

    async def _eval(
        self, name: str, keys: tuple[str, ...], *args: str | int, idempotent: bool = False
    ) -> object:
        script = self._scripts[name]
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

    async def _command(self, *args: str | int | bytes) -> object:
        try:
            async with deadline_after(self._op_timeout):
                return await self._pool.call(*args)
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: BaseException) -> StateUnavailableError:
        return unavailable_error(exc, self._where, self._op_timeout)

    # -- the State protocol -----------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire`."""
        lock_key = self.lock_key(key)
        result = await self._eval(
            "acquire",
            (lock_key, f"{lock_key}:abandoned:{owner}"),
            owner,
            ttl_ms(ttl),
            self._process if waiting else "",
            idempotent=True,
        )
        value = _as_int(result)
        if value > 0:
            return Grant(value)
        return Grant(None, -value / 1000.0)

    async def acquire_claimed(
        self, key: str, owner: str, ttl: float, *, claim: str, claim_ttl: float
    ) -> Grant | None:
        """See :meth:`asynclock.state.ClaimingState.acquire_claimed` (one EVALSHA)."""
        lock_key = self.lock_key(key)
        result = await self._eval(
            "claim_acquire",
            (lock_key, f"{lock_key}:abandoned:{owner}", self._prefix + claim),
            owner,
            ttl_ms(ttl),
            "",
            ttl_ms(claim_ttl),
        )
        if result is None:
            return None
        value = _as_int(result)
        if value > 0:
            return Grant(value)
        return Grant(None, -value / 1000.0)

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release`."""
        lock_key = self.lock_key(key)
        result = _as_int(
            await self._eval(
                "release",
                (lock_key, f"{lock_key}:released", f"{lock_key}:abandoned:{successor or ''}"),
                owner,
                successor or "",
                ttl_ms(ttl) if successor and ttl else 0,
                self._retention_ms,
                self._reservation_ms,
            )
        )
        if result < 0:
            return Release(owned=False)
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
        reply = await self._eval(
            "extend", (self.lock_key(key),), owner, ttl_ms(ttl), idempotent=True
        )
        return _as_int(reply) == 1

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
        start = len(self._prefix) + 1
        pattern = f"{_glob_escape(self._prefix)}{{{match}}}"
        cursor: bytes | int = 0
        while True:
            reply = await self._command("SCAN", cursor, "MATCH", pattern, "COUNT", 500)
            assert isinstance(reply, list)
            cursor, keys = reply
            for raw in keys:
                lock_key = raw.decode() if isinstance(raw, bytes) else str(raw)
                info = await self._eval("inspect", (lock_key,), idempotent=True)
                if isinstance(info, list) and len(info) == 3:
                    owner, pttl, token = info
                    yield LockInfo(
                        lock_key[start:-1],
                        owner.decode() if isinstance(owner, bytes) else str(owner),
                        max(_as_int(pttl), 0) / 1000.0,
                        _as_int(token),
                    )
            if _as_int(cursor) == 0:
                return

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
        reply = await self._command("SET", self._prefix + key, b"1", "NX", "PX", ttl_ms(ttl))
        return reply is not None

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget`."""
        return _as_int(await self._command("DEL", self._prefix + key)) > 0

    @contextlib.asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.State.watch` (one shared pub/sub connection)."""
        if self._subscriber is None:
            self._subscriber = Subscriber(self._client, self._op_timeout or 5.0)
        subscriber = self._subscriber
        channel = f"{self.lock_key(key)}:released".encode()
        watch = EventWatch(asyncio.get_running_loop())
        with map_driver_errors(_UNAVAILABLE, self._where, self._op_timeout):
            await subscriber.add(channel, watch)
        try:
            yield watch
        finally:
            subscriber.discard(channel, watch)


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


def _describe(client: Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
