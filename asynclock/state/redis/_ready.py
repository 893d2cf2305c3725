"""The inbox's set of keys with work, as one topology lays it out (see :class:`ReadyIndex`).

On one server (plain or Sentinel) it is one sorted set, :class:`ReadySet`; on Redis Cluster it is
sharded by hash slot (``_cluster_inbox.py``). ``RedisState``'s inbox methods only talk to the
index, so they hold no topology branch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable


class Command(Protocol):
    """The state's guarded command: ``command(key, *args)``, on the server owning ``key``."""

    def __call__(self, key: str, *args: str | int | bytes) -> Awaitable[object]: ...


class ReadyIndex(Protocol):
    """Where the keys with work are kept, and how workers hear of new work.

    Invariant: a key with pending entries is a member of the set :meth:`ready_key` names for it
    (``inbox_accept.lua`` adds it, the drain step removes it once its inbox is empty, in the
    same atomic steps), and :meth:`keys` reads every such set.
    """

    #: ``ARGV`` "listing" of an accept or requeue (``_listed.lua``): ``''`` never needs one
    listing: str

    def ready_key(self, lock_key: str) -> str:
        """The set of keys with work that ``lock_key``'s key joins (in its slot on a cluster)."""
        ...

    def listed_key(self, lock_key: str) -> str:
        """The listing mark of :meth:`ready_key` (``_listed.lua``)."""
        ...

    async def list_for(self, lock_key: str, generation: str | None = None) -> str:
        """List ``lock_key``'s set in the directory under ``generation`` (``None``: a fresh
        one); the generation to come back with."""
        ...

    async def keys(self) -> list[str]:
        """Every key with pending entries, oldest first."""
        ...

    async def lock_values(self, lock_keys: list[str]) -> list[object]:
        """The values of ``lock_keys`` (``None`` for a missing one), in one round."""
        ...

    async def lane_for(self, lock_key: str) -> str:
        """The hand-out lane of ``lock_key``'s key: on its server, where one script reaches it."""
        ...

    async def lanes(self) -> list[str]:
        """Every hand-out lane a worker waits on (one per server)."""
        ...

    def lane_moved(self) -> None:
        """A script found its lane on another server (a cluster's slots moved): look again."""
        ...

    async def aclose(self) -> None:
        """Close what the index opened."""
        ...


class ReadySet:
    """One server: one sorted set ``P inbox:ready`` (key -> accept time of its oldest work), and
    one hand-out lane ``P inbox:lane``."""

    listing = ""

    def __init__(self, prefix: str, command: Command) -> None:
        """``command(key, *args)`` runs one command (the state's, under its deadline)."""
        self._key = f"{prefix}inbox:ready"
        self._lane = f"{prefix}inbox:lane"
        self._command = command

    def ready_key(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.ready_key` (the one set, whatever the key)."""
        return self._key

    def listed_key(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.listed_key` (never read: the listing is ``''``)."""
        return self._key

    async def list_for(self, lock_key: str, generation: str | None = None) -> str:
        """Never called: the one set is always listed."""
        raise AssertionError("a single Redis server lists no slot")

    async def keys(self) -> list[str]:
        """See :meth:`ReadyIndex.keys` (one ZRANGE)."""
        reply = await self._command(self._key, "ZRANGE", self._key, 0, -1)
        assert isinstance(reply, list)
        return [m.decode() if isinstance(m, bytes) else str(m) for m in reply]

    async def lock_values(self, lock_keys: list[str]) -> list[object]:
        """See :meth:`ReadyIndex.lock_values` (one MGET)."""
        if not lock_keys:
            return []
        reply = await self._command(lock_keys[0], "MGET", *lock_keys)
        assert isinstance(reply, list)
        return reply

    async def lane_for(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.lane_for` (the one lane, whatever the key)."""
        return self._lane

    async def lanes(self) -> list[str]:
        """See :meth:`ReadyIndex.lanes`."""
        return [self._lane]

    def lane_moved(self) -> None:
        """Never called: one server's lane cannot be elsewhere."""

    async def aclose(self) -> None:
        """Nothing to close."""
