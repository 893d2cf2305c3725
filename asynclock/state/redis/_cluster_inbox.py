"""The inbox's set of keys with work on Redis Cluster: one sorted set per hash slot, and a directory.

A script reaches the keys of one slot only, and ``accept`` must stay one script (one round trip,
atomic with the dedupe record and the append). So the set a key joins lives in the key's own slot:
``P{t}:inbox:ready``, where ``t`` is a tag chosen to hash to that slot (:func:`slot_tag`). That
spreads the writes of accept and drain over every slot, hence every master: no hot slot.

A rescan must not read 16,384 sets, nor SCAN every node. A *directory* lists the slots whose set
may have members: slot ``s`` is listed (slot -> generation) in the hash of its *block*, ``s //
BLOCK``: ``P{t}:inbox:slots`` with ``t`` the tag of the block's first slot. So there are
``BLOCKS`` hashes whose names do not depend on the topology, and, a master serving ranges of
slots, a block's hash is on the master of the block's slots, except where a range boundary cuts
the block. A rescan reads the hashes of each master with one script there
(``inbox_directory.lua``). The directory is written only when a slot starts or stops being
listed, not per event. Invariants (``_listed.lua``):

* A slot's set gains a key only while its *listing mark* ``P{t}:inbox:listed`` exists, and the
  mark holds a generation that was written into the directory before it was set (or in the same
  script). So a slot with work is always in the directory: the accept that finds no mark writes
  the fresh generation it came with into its block's hash and sets the mark, one script, when
  that hash is on the same master (a key of another slot that a script may touch, as the
  hand-out lane is); else it answers ``unlisted`` and the client writes a fresh generation
  through the cluster, then runs the accept again (three round trips, once per slot listing).
  A generation is unique per listing (:meth:`SlotReadySets.fresh`): pruning compares them.
* A slot leaves the directory in two fenced steps: ``inbox_unlist.lua`` removes the mark of an
  *empty* set (atomic with that emptiness, in the slot) and returns its generation;
  ``inbox_forget_slot.lua`` then removes the directory entry only if it still holds that
  generation. An accept that listed the slot again in between wrote a newer one, so its entry
  stays. A crash between the two steps leaves an entry listing an empty slot: one extra read per
  rescan until the slot is listed again, never a key missed.

A key that waits for a retry stays in its slot's set, its score the due time (``_hold.lua``):
the slot stays listed, and the rescan after the due time finds the key (``inbox_ready.lua``
returns each set's members with its master's clock, the one that set the scores). A parked key
leaves its set (accepts behind it append without listing the slot), so however many keys stay
parked, no rescan reads them and their slots can leave the directory; ``inbox_requeue.lua``
lists the slot again when it unparks the key, as an accept would.

Workers hear of new work through the hand-out (``_handout.lua``): a grant goes onto the lane of
the key's master, a list in the lowest slot that master serves (:meth:`SlotReadySets.lane_for`),
which a script of any slot of that master reaches (an undeclared key of another slot on the same
node: allowed to scripts without flags). Each worker waits on every master's lane. When the
slots move, a script that finds its lane elsewhere leaves the key to a rescan and the lanes are
looked up again.
"""

from __future__ import annotations

import asyncio
import binascii
import itertools
import time
import uuid
from functools import cache
from typing import TYPE_CHECKING

from asynclock.state.redis._cluster import SLOTS, slot_of
from asynclock.state.redis._ready import read_scored

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from contextlib import AbstractAsyncContextManager

    from asynclock.state.redis._cluster import Address, ClusterRouter
    from asynclock.state.redis._transport import Script

#: slots per block of the directory: slot ``s`` is listed in the hash of block ``s // BLOCK``
BLOCK = 64
#: hashes of the directory of slots with work, one per block
BLOCKS = SLOTS // BLOCK
#: seconds between two prunings of the directory by one process; a slot is taken off only if its
#: set was empty at two prunings in a row (so a slot in use is not re-listed over and over)
PRUNE_EVERY = 30.0


@cache
def _slot_tags() -> tuple[str, ...]:
    """A hash tag for every slot (``inbox-<hex>``, the first of that form hashing to it).

    Redis Cluster hashes with CRC16-CCITT (XMODEM), which is ``binascii.crc_hqx(data, 0)``;
    finding all 16,384 takes ~0.06 s, once per process.
    """
    tags: list[str | None] = [None] * SLOTS
    left, n = SLOTS, 0
    while left:
        name = b"inbox-%x" % n
        slot = binascii.crc_hqx(name, 0) % SLOTS
        if tags[slot] is None:
            tags[slot] = name.decode()
            left -= 1
        n += 1
    return tuple(t for t in tags if t is not None)


def slot_tag(slot: int) -> str:
    """A hash tag whose keys live in ``slot``."""
    return _slot_tags()[slot]


class SlotReadySets:
    """:class:`~asynclock.state.redis._ready.ReadyIndex` of a cluster (see the module)."""

    def __init__(
        self,
        router: ClusterRouter,
        prefix: str,
        guard: Callable[[], AbstractAsyncContextManager[None]],
        *,
        unlist: Script,
        forget: Script,
        read: Script,
        directory: Script,
        op_timeout: float,
    ) -> None:
        """``guard()``: one operation's deadline and error mapping (the state's); the scripts
        ``inbox_unlist.lua``, ``inbox_forget_slot.lua``, ``inbox_ready.lua`` and
        ``inbox_directory.lua``."""
        self._router = router
        self._prefix = prefix
        self._guard = guard
        self._unlist = unlist
        self._forget = forget
        self._read = read
        self._read_directory = directory
        self._op_timeout = op_timeout
        self.directory = tuple(
            # never a name ending in "}": held_locks() takes those for locks
            f"{prefix}{{{slot_tag(block * BLOCK)}}}:inbox:slots"
            for block in range(BLOCKS)
        )
        # generations: this index's random origin and a count, unique without a round trip
        self._origin = uuid.uuid4().hex[:16]
        self._generations = itertools.count()
        self._pruned_at = time.monotonic()
        self._empty_at_last_prune: set[int] = set()
        self._known: set[int] = set()  # the slots the directory listed at the last read

    def _set_of(self, slot: int) -> str:
        return f"{self._prefix}{{{slot_tag(slot)}}}:inbox:ready"

    def _read_set(self, slot: int) -> tuple[int, tuple[str | int, ...]]:
        return slot, ("EVALSHA", self._read.sha, 1, self._set_of(slot))

    def ready_key(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.ready_key`: the set of the key's slot."""
        return self._set_of(slot_of(lock_key))

    def _mark_of(self, slot: int) -> str:
        return f"{self._prefix}{{{slot_tag(slot)}}}:inbox:listed"

    def listed_key(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.listed_key`."""
        return self._mark_of(slot_of(lock_key))

    def directory_of(self, slot: int) -> str:
        """The hash of the directory that lists ``slot``: its block's."""
        return self.directory[slot // BLOCK]

    def fresh(self) -> str:
        """A generation no listing had before."""
        return f"{self._origin}.{next(self._generations)}"

    def listing_for(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.listing_for`: a fresh generation, the slot and its directory
        hash, for the script to list the slot itself (``_listed.lua``)."""
        slot = slot_of(lock_key)
        return f"?{self.fresh()} {slot} {self.directory_of(slot)}"

    async def list_for(self, lock_key: str, generation: str | None = None) -> str:
        """See :meth:`ReadyIndex.list_for`: ``generation`` (or a fresh one) for the slot, in
        its directory hash (when the script could not reach it: ``_listed.lua``)."""
        slot = slot_of(lock_key)
        directory = self.directory_of(slot)
        generation = generation or self.fresh()
        async with self._guard():
            await self._router.call(slot_of(directory), "HSET", directory, slot, generation)
        return generation

    async def keys(self, *, due: bool = False) -> list[str]:
        """See :meth:`ReadyIndex.keys`: the directory (:meth:`listed`), and the sets it lists
        (``inbox_ready.lua`` on each: its members and the clock of its master, which set their
        due times).

        The sets of the slots listed at the previous call are read at the same time as the
        directory (pipelined per master, the masters at once), so a steady inbox costs one
        round; a slot listed since then costs a second one. A key that had work when the call
        began is returned: its slot was listed before that (``_listed.lua``), so the directory
        read shows it, and its set is read after the call began, in either round. Every
        ``PRUNE_EVERY`` s, pruning.
        """
        router = self._router
        known = sorted(self._known)
        async with self._guard():
            listed, read = await asyncio.gather(
                self.listed(),
                router.call_each([self._read_set(s) for s in known], script=self._read.text),
            )
            sets = dict(zip(known, read, strict=True))
            new = sorted(listed - self._known)
            if new:
                read = await router.call_each(
                    [self._read_set(s) for s in new], script=self._read.text
                )
                sets.update(zip(new, read, strict=True))
        self._known = listed
        found: list[tuple[float, str]] = []
        empty: set[int] = set()
        for slot, reply in sets.items():
            now_ms, pairs = read_scored(reply)
            if not pairs and slot in listed:
                empty.add(slot)
            found.extend(pair for pair in pairs if not due or pair[0] <= now_ms)
        if time.monotonic() - self._pruned_at >= PRUNE_EVERY:
            await self.prune(empty & self._empty_at_last_prune)
            self._empty_at_last_prune = empty
        return [key for _, key in sorted(found)]

    async def listed(self) -> set[int]:
        """The slots the directory lists: one ``inbox_directory.lua`` per master reads the block
        hashes it holds (by the slot map; one found elsewhere, the slots having moved, is then
        read alone). The caller holds the guard."""
        router = self._router
        by_master: dict[Address, list[str]] = {}
        for block, name in enumerate(self.directory):
            by_master.setdefault(await router.address_of(block * BLOCK), []).append(name)
        groups = list(by_master.values())
        script = self._read_directory
        replies = await router.call_each(
            [(slot_of(names[0]), ("EVALSHA", script.sha, 1, *names)) for names in groups],
            script=script.text,
        )
        listed: set[int] = set()
        for names, reply in zip(groups, replies, strict=True):
            for name, slots in zip(names, _list(reply), strict=True):
                if slots is None:
                    slots = await router.call(slot_of(name), "HKEYS", name)
                listed.update(int(_text(slot)) for slot in _list(slots))
        return listed

    async def prune(self, slots: Sequence[int] | set[int]) -> int:
        """Take the ``slots`` whose set is empty off the directory (fenced, see the module);
        returns how many left it."""
        self._pruned_at = time.monotonic()
        ordered = sorted(slots)
        if not ordered:
            return 0
        router = self._router
        async with self._guard():
            unlist = []
            for slot in ordered:
                keys = (self._set_of(slot), self._mark_of(slot))
                unlist.append((slot, ("EVALSHA", self._unlist.sha, 2, *keys)))
            generations = await router.call_each(unlist, script=self._unlist.text)
            forget = []
            for slot, generation in zip(ordered, generations, strict=True):
                if generation is not None:
                    directory = self.directory_of(slot)
                    args = ("EVALSHA", self._forget.sha, 1, directory, slot, _text(generation))
                    forget.append((slot_of(directory), args))
            removed = await router.call_each(forget, script=self._forget.text)
        return sum(int(_text(r)) for r in removed)

    async def lock_values(self, lock_keys: list[str]) -> list[object]:
        """See :meth:`ReadyIndex.lock_values` (one pipelined GET per key, the masters at once)."""
        if not lock_keys:
            return []
        async with self._guard():
            return await self._router.call_each([(slot_of(k), ("GET", k)) for k in lock_keys])

    async def lane_for(self, lock_key: str) -> str:
        """See :meth:`ReadyIndex.lane_for`: the lane of the master owning the key's slot."""
        async with self._guard():
            address = await self._router.address_of(slot_of(lock_key))
        return self._lane_of(address)

    async def lanes(self) -> list[str]:
        """See :meth:`ReadyIndex.lanes`: one per master of the slot map."""
        async with self._guard():
            await self._router.refresh()
        return [self._lane_of(address) for address in self._router.masters]

    def lane_moved(self) -> None:
        """See :meth:`ReadyIndex.lane_moved`: read the slot map again before the next command."""
        self._router.mark_stale()

    def _lane_of(self, address: Address) -> str:
        """``address``'s hand-out lane: a key in the lowest slot it serves, so a script of any
        slot of that master reaches it (``_handout.lua``)."""
        slot = self._router.first_slot(address)
        return f"{self._prefix}{{{slot_tag(slot)}}}:inbox:lane"

    async def aclose(self) -> None:
        """Nothing to close: the index opens no connection of its own."""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _list(reply: object) -> list[object]:
    assert isinstance(reply, list)
    return reply
