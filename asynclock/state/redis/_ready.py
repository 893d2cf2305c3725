"""The inbox's set of keys with work, as one topology lays it out (see :class:`ReadyIndex`).

On one server (plain or Sentinel) it is one sorted set, :class:`ReadySet`; on Redis Cluster it is
sharded by hash slot (``_cluster_inbox.py``). ``RedisState``'s inbox methods only talk to the
index, so they hold no topology branch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


class Command(Protocol):
    """The state's guarded command: ``command(key, *args)``, on the server owning ``key``."""

    def __call__(self, key: str, *args: str | int | bytes) -> Awaitable[object]: ...


class ReadyIndex(Protocol):
    """Where the keys with work are kept, and how workers hear of new work.

    Invariant: a key with pending entries that is not parked is a member of the set
    :meth:`ready_key` names for it (``inbox_accept.lua`` adds it, the drain step removes it once
    its inbox is empty or it parks, ``inbox_requeue.lua`` adds it back when it unparks, in the
    same atomic steps), and :meth:`keys` reads every such set. A member's score is the accept
    time of its oldest work, or, while a retry waits, the retry's due time (``_hold.lua``), by
    the clock of the server holding the set.
    """

    def ready_key(self, lock_key: str) -> str:
        """The set of keys with work that ``lock_key``'s key joins (in its slot on a cluster)."""
        ...

    def listed_key(self, lock_key: str) -> str:
        """The listing mark of :meth:`ready_key` (``_listed.lua``)."""
        ...

    def listing_for(self, lock_key: str) -> str:
        """The ``ARGV`` "listing" an accept or requeue of ``lock_key``'s key first runs with
        (``_listed.lua``): ``''`` never needs one."""
        ...

    async def list_for(self, lock_key: str, generation: str | None = None) -> str:
        """List ``lock_key``'s set in the directory under ``generation`` (``None``: a fresh
        one); the generation to come back with."""
        ...

    async def keys(self, *, due: bool = False) -> list[str]:
        """Every key with pending entries that is not parked, oldest first; with ``due``, not
        those that wait for a retry that is not due yet (by the server's clock)."""
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
    """One server: one sorted set ``P inbox:ready`` (key -> accept time of its oldest work, or
    due time of its retry), and one hand-out lane ``P inbox:lane``."""

    def __init__(
        self, prefix: str, command: Command, read: Callable[[str], Awaitable[object]]
    ) -> None:
        """``command(key, *args)`` runs one command (the state's, under its deadline);
        ``read(set)`` runs ``inbox_ready.lua`` on a set (likewise)."""
        self._key = f"{prefix}inbox:ready"
        self._lane = f"{prefix}inbox:lane"
        self._command = command
        self._read = read

    def ready_key(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.ready_key` (the one set, whatever the key)."""
        return self._key

    def listed_key(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.listed_key` (never read: the listing is ``''``)."""
        return self._key

    def listing_for(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.listing_for`: ``''``, the one set needs no listing."""
        return ""

    async def list_for(self, lock_key: str, generation: str | None = None) -> str:
        """Never called: the one set is always listed."""
        raise AssertionError("a single Redis server lists no slot")

    async def keys(self, *, due: bool = False) -> list[str]:
        """See :meth:`ReadyIndex.keys` (one EVALSHA of ``inbox_ready.lua``)."""
        now_ms, scored = read_scored(await self._read(self._key))
        return [key for score, key in scored if not due or score <= now_ms]

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


def read_scored(reply: object) -> tuple[float, list[tuple[float, str]]]:
    """``inbox_ready.lua``'s reply: the server's ms, and the ``(score, key)`` of every member."""
    assert isinstance(reply, list)
    now_ms, *items = (item.decode() if isinstance(item, bytes) else str(item) for item in reply)
    pairs = [(float(items[i + 1]), items[i]) for i in range(0, len(items), 2)]
    return float(now_ms), pairs
