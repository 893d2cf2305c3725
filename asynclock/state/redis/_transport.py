"""What RedisState needs of a Redis topology: the :class:`Transport` interface.

RedisState is written once, against this interface; each topology implements it in its own
module: one server (``_plain.py``: :class:`~asynclock.state.redis._plain.PlainTransport`), a
Sentinel-named master (``_sentinel.py``) and a cluster (``_cluster_transport.py``), each over
:class:`~asynclock.state.redis._pool.LeanPool`. ``_clients.py`` picks one by the client's type.

A transport does the I/O and nothing else: it neither bounds an operation nor maps its errors.
RedisState runs every call of one under its :class:`~asynclock.state._guard.OperationGuard`
(the ``op_timeout`` deadline, and :data:`UNAVAILABLE` becomes StateUnavailableError).

What differs by topology and is not I/O is data the transport hands out: the key layout
(:class:`LockKeys`: the lock-key brace rule and which keys one script may touch), the script
variant (``clustered``: sharded ``SPUBLISH``), and the inbox's set of keys with work
(``ready_index``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from redis import exceptions as redis_errors

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Mapping

    from redis.asyncio.connection import AbstractConnection

    from asynclock.state._guard import OperationGuard
    from asynclock.state.redis._pool import ServerPool
    from asynclock.state.redis._ready import Command, ReadyIndex
    from asynclock.state.redis._subscriber import ShardedSubscriber, Subscriber

__all__ = ["UNAVAILABLE", "LockKeys", "Script", "Transport", "glob_escape"]

#: driver errors meaning "the server cannot serve this operation now" (StateUnavailableError)
UNAVAILABLE: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    OSError,
    # a cluster that lost a master (or has no node answering) cannot serve the key right now
    redis_errors.ClusterDownError,
    redis_errors.SlotNotCoveredError,
)

Args = tuple[str | int, ...]


class Script(Protocol):
    """A Lua script as a transport runs it: EVALSHA of ``sha``, loading ``text`` if missing."""

    @property
    def sha(self) -> str: ...
    @property
    def text(self) -> str: ...


class Transport(Protocol):
    """Commands and scripts on one Redis topology (see the module).

    Invariant: every I/O method is one operation (for :meth:`scan`, each page is one), even
    when it takes several exchanges (a ``NOSCRIPT`` answered by loading the script, a cluster
    redirection followed), and is safe to bound by a deadline from outside: a call cut short
    leaves no connection that could be reused out of sync.
    """

    @property
    def clustered(self) -> bool:
        """Whether this is a Redis Cluster (scripts publish sharded, no ``replicas=``)."""
        ...

    @property
    def where(self) -> str:
        """Where the server is, for errors (the state's guard starts with it)."""
        ...

    @property
    def pool(self) -> ServerPool | None:
        """The connection pool of one server (Sentinel: the master's); ``None`` on a cluster."""
        ...

    @property
    def master(self) -> tuple[str, int] | None:
        """The master's address as last named by the sentinels (``None``: not Sentinel)."""
        ...

    def describe(self, where: str) -> str:
        """What ``repr(state)`` shows of the server, given the state's ``where``."""
        ...

    def lock_keys(self, prefix: str) -> LockKeys:
        """The key layout of this topology for ``prefix``."""
        ...

    async def eval(
        self, script: Script, keys: tuple[str, ...], args: Args, idempotent: bool = False
    ) -> object:
        """EVALSHA ``script`` (loaded first where the server says NOSCRIPT); its reply.

        ``idempotent``: a dead idle connection may be retried once on a fresh one.
        """
        ...

    async def eval_waited(
        self, script: Script, keys: tuple[str, ...], args: Args, wait: Args
    ) -> tuple[object, object]:
        """:meth:`eval`, then the ``wait`` command (``WAIT n ms``) in the same write on the
        same connection; both replies, an error reply returned, not raised. Not on a cluster."""
        ...

    async def command(self, key: str, *args: str | int | bytes) -> object:
        """One command about ``key`` (``args`` include it), on the server owning it."""
        ...

    def scan(self, pattern: str) -> AsyncGenerator[list[str], None]:
        """The keys matching ``pattern``, one ``SCAN`` page per item (every master's)."""
        ...

    async def each_master(self, *args: str | int | bytes) -> list[tuple[str, object]]:
        """One command on every master (the one server; under Sentinel, the master the
        sentinels name; every master of a cluster's slot map): each one's address and reply."""
        ...

    def subscriber(self, op_timeout: float) -> Subscriber | ShardedSubscriber:
        """A new subscriber for the release channels of this topology."""
        ...

    async def blocking_connection(self, key: str) -> AbstractConnection:
        """A new connection, connected, to the server owning ``key``, for blocking commands
        (the inbox's BRPOP): nobody else uses it; the caller closes it."""
        ...

    def ready_index(
        self,
        prefix: str,
        command: Command,
        guard: OperationGuard,
        scripts: Mapping[str, Script],
    ) -> ReadyIndex:
        """The inbox's set of keys with work. ``command`` is the state's (guarded)
        :meth:`command`; ``scripts`` the state's, for the indexes that run their own."""
        ...

    async def aclose(self, *, owned: bool) -> None:
        """Close the connections this transport opened (``owned``: the state built the
        client, so what the client opened itself, such as sentinel connections, too)."""
        ...


class LockKeys:
    """One server's key layout: lock ``key`` lives at ``P{key}``, and a script may touch any
    two keys.

    The braces make the user's key the hash tag, so on a cluster (``BracedLockKeys`` in
    ``_cluster_transport.py``) everything about one lock lives in one slot; on one server they are only a layout.
    """

    __slots__ = ("_glob", "prefix")

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._glob = glob_escape(prefix)

    def lock_key(self, key: str) -> str:
        """The Redis key of lock ``key``."""
        return f"{self.prefix}{{{key}}}"

    def key_of(self, lock_key: str) -> str:
        """The lock key's ``key`` (the inverse of :meth:`lock_key`)."""
        return lock_key[len(self.prefix) + 1 : -1]

    def patterns(self, match: str) -> tuple[str, ...]:
        """SCAN patterns that together list each lock key whose key matches ``match`` once
        (with :meth:`lists`)."""
        return (f"{self._glob}{{{match}}}",)

    def lists(self, number: int, lock_key: str) -> bool:
        """Whether pattern ``number`` of :meth:`patterns` is the one that lists ``lock_key``."""
        return True

    def atomic_with(self, lock_key: str, name: str) -> bool:
        """Whether one script may touch ``name`` along with ``lock_key`` (one server: always)."""
        return True


def glob_escape(text: str) -> str:
    """Escape Redis glob characters so ``text`` matches only itself."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
