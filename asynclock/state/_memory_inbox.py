"""MemoryState's durable inbox (:class:`~asynclock.state.InboxState`), in this process's memory.

Beside the lock table (``_memory_locks.py``), whose mutex it shares: an inbox step is fenced by
the key's lock and may release it (release-if-empty), so both change in one step under one
mutex. The hand-out of keys to workers is ``_memory_handout.py``. "Durable" here means for the
process's life: it is memory.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asynclock._errors import LockNotOwnedError
from asynclock._owner import new_owner
from asynclock._validate import check_inbox_finish, check_key, check_limit, check_ttl
from asynclock.state._memory_handout import Handout, MemoryWorker
from asynclock.state._protocol import (
    DeadLetter,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxGrant,
    InboxKey,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Collection

    from asynclock.state._memory_locks import LockTable

__all__ = ["MemoryInbox"]


@dataclass(slots=True)
class _Entry:
    id: int
    attempts: int
    payload: str
    accepted_at: float


@dataclass(slots=True)
class _Inbox:
    """One key's inbox: its pending entries, oldest first, and its dead letters.

    A key waiting for a retry (``due``: when its head is due, by the state's clock) or parked
    is not handed out, listed as ready or taken; it holds no lock meanwhile.
    """

    entries: deque[_Entry] = field(default_factory=deque)
    dead: list[DeadLetter] = field(default_factory=list)
    next_id: int = 1
    due: float | None = None
    parked: bool = False

    def blocked(self, now: float) -> bool:
        """Parked, or waiting for a retry that is not due yet."""
        return self.parked or (self.due is not None and self.due > now)


class MemoryInbox:
    """The inboxes of one :class:`~asynclock.MemoryState`, and their hand-out.

    Invariants: every operation is one step under the lock table's mutex, after one yield and
    never later; an entry leaves only through a step of its key's lock holder.
    """

    __slots__ = ("handout", "inboxes", "table")

    def __init__(self, table: LockTable) -> None:
        self.table = table
        self.inboxes: dict[str, _Inbox] = {}
        #: keys with work and no holder, and the workers waiting for one
        self.handout = Handout()

    async def accept(
        self,
        key: str,
        payload: str,
        *,
        claim: str | None,
        claim_ttl: float,
        max_pending: int,
        lock_ttl: float = 30.0,
        with_entry: bool = True,
    ) -> InboxAccepted:
        """See :meth:`asynclock.state.MemoryState.inbox_accept`."""
        table = self.table
        check_key(key)
        await asyncio.sleep(0)
        with table.mutex:
            now = table.clock()
            table.sweep(now)
            inbox = self.inboxes.get(key)
            pending = len(inbox.entries) if inbox is not None else 0
            if claim is not None:
                expires_at = table.dedupe.get(claim)
                if expires_at is not None and expires_at > now:
                    return InboxAccepted("duplicate", pending)
            if pending >= max_pending:
                return InboxAccepted("full", pending)
            if claim is not None:
                table.add(claim, now, claim_ttl)
            if inbox is None:
                inbox = self.inboxes[key] = _Inbox()
            inbox.entries.append(_Entry(inbox.next_id, 0, payload, now))
            inbox.next_id += 1
            # else the holder's next step takes the entry, or the key waits (retry, parked)
            if not inbox.blocked(now) and table.live(key, now) is None:
                self.handout.offer(key)
            return InboxAccepted("accepted", pending + 1)

    async def step(
        self,
        key: str,
        owner: str,
        *,
        done: int | None = None,
        dead: str | None = None,
        take: bool = True,
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxEntry | None:
        """See :meth:`asynclock.state.InboxState.inbox_step`."""
        table = self.table
        wait = check_inbox_finish(key, done=done, dead=dead, retry_in=retry_in, park=park)
        await asyncio.sleep(0)
        with table.mutex:
            now = table.clock()
            inbox = self.held_inbox(key, owner, now)
            if wait is not None or park:
                finished = (done,) if done is not None else ()
                self.set_aside(key, owner, inbox, finished, dead, wait, now)
                return None
            entries = inbox.entries if inbox is not None else deque()
            if inbox is not None and done is not None:
                # the head, unless dead letters were requeued in front of it meanwhile
                gone = next((entry for entry in entries if entry.id == done), None)
                if gone is not None:
                    entries.remove(gone)
                    if dead is not None:
                        inbox.dead.append(
                            DeadLetter(key, gone.id, gone.attempts, dead, gone.payload)
                        )
            if entries:
                head = entries[0]
                head.attempts += 1 if take else 0
                if inbox is not None:
                    inbox.due = None  # its holder hands it out: no retry waits any more
                age = now - head.accepted_at
                return InboxEntry(head.id, head.attempts, head.payload, age, len(entries))
            self.drained(key, owner, inbox, now)
            return None

    async def take(
        self,
        key: str,
        owner: str,
        *,
        done: Collection[int] = (),
        dead: str | None = None,
        limit: int,
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxBatch | None:
        """See :meth:`asynclock.state.InboxState.inbox_take`."""
        table = self.table
        check_limit(limit)
        finished = frozenset(done)
        wait = check_inbox_finish(key, done=finished, dead=dead, retry_in=retry_in, park=park)
        await asyncio.sleep(0)
        with table.mutex:
            now = table.clock()
            inbox = self.held_inbox(key, owner, now)
            if wait is not None or park:
                self.set_aside(key, owner, inbox, finished, dead, wait, now)
                return None
            if inbox is None:
                self.drained(key, owner, inbox, now)
                return None
            if finished:
                kept: deque[_Entry] = deque()
                for entry in inbox.entries:
                    if entry.id not in finished:
                        kept.append(entry)
                    elif dead is not None:
                        inbox.dead.append(
                            DeadLetter(key, entry.id, entry.attempts, dead, entry.payload)
                        )
                inbox.entries = kept
            entries = inbox.entries
            if entries:
                pending = len(entries)
                if limit:
                    inbox.due = None  # its holder hands entries out: no retry waits any more
                handed = []
                for entry in itertools.islice(entries, limit):
                    entry.attempts += 1
                    age = now - entry.accepted_at
                    handed.append(InboxEntry(entry.id, entry.attempts, entry.payload, age, pending))
                return InboxBatch(tuple(handed), pending, now - entries[-1].accepted_at)
            self.drained(key, owner, inbox, now)
            return None

    def held_inbox(self, key: str, owner: str, now: float) -> _Inbox | None:
        """``key``'s inbox for a step of ``owner`` (mutex held): ``LockNotOwnedError`` unless
        ``owner`` holds ``key``'s lock."""
        held = self.table.live(key, now)
        if held is None or held.owner != owner:
            raise LockNotOwnedError(key, owner)
        return self.inboxes.get(key)

    def drained(self, key: str, owner: str, inbox: _Inbox | None, now: float) -> None:
        """A step found nothing pending (mutex held): the inbox goes unless it keeps dead
        letters, and ``owner``'s lock is released in the same step (release-if-empty)."""
        if inbox is not None and not inbox.dead:
            del self.inboxes[key]
        self.table.release(key, owner, None, None, now)

    def set_aside(
        self,
        key: str,
        owner: str,
        inbox: _Inbox | None,
        finished: Collection[int],
        dead: str | None,
        wait: float | None,
        now: float,
    ) -> None:
        """A step's retry that waits (``wait`` seconds) or its parking (``finished``, the ids
        of the entries done, moved to the dead letters with ``dead``): then the lock is released
        (mutex held). The entries that wait keep their attempt counts: the next hand-out counts one
        more."""
        table = self.table
        if inbox is None:  # (nothing pending: the step found its entry gone, as done= would)
            inbox = self.inboxes[key] = _Inbox()
        if wait is not None:
            inbox.due = now + wait
        else:
            assert dead is not None
            for entry in [e for e in inbox.entries if e.id in finished]:
                inbox.entries.remove(entry)
                inbox.dead.append(DeadLetter(key, entry.id, entry.attempts, dead, entry.payload))
            inbox.parked = True
            inbox.due = None
        if not inbox.entries and not inbox.dead:
            del self.inboxes[key]  # (a retry of an entry gone already: nothing waits)
        table.release(key, owner, None, None, now)

    async def ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready`."""
        table = self.table
        await asyncio.sleep(0)
        with table.mutex:
            now = table.clock()
            waiting = [
                (b.entries[0].accepted_at, k)
                for k, b in self.inboxes.items()
                if b.entries and not b.blocked(now) and table.live(k, now) is None
            ]
        return [key for _, key in sorted(waiting)]

    @asynccontextmanager
    async def worker(self, *, lock_ttl: float, with_entry: bool) -> AsyncIterator[MemoryWorker]:
        """See :meth:`asynclock.state.InboxState.inbox_worker` (``_memory_handout.py``)."""
        table = self.table
        check_ttl(lock_ttl, "lock_ttl")
        worker = MemoryWorker(
            self.handout, table.mutex, lambda key: self.hand_out(lock_ttl, with_entry, key)
        )
        try:
            yield worker
        finally:
            worker.close()

    def hand_out(self, lock_ttl: float, with_entry: bool, key: str | None) -> InboxGrant | None:
        """Take ``key`` (``None``: the oldest offered key that still has work and no holder):
        its lock for a fresh owner, and its head handed out with ``with_entry`` (call with the
        mutex held)."""
        if key is not None:
            return self.take_key(key, lock_ttl, with_entry)
        while (offered := self.handout.pop()) is not None:
            grant = self.take_key(offered, lock_ttl, with_entry)
            if grant is not None:
                return grant
        return None

    def take_key(self, key: str, lock_ttl: float, with_entry: bool) -> InboxGrant | None:
        """``key``'s grant if it has work and no holder, else ``None`` (mutex held)."""
        table = self.table
        now = table.clock()
        inbox = self.inboxes.get(key)
        if inbox is None or not inbox.entries or table.live(key, now) is not None:
            return None  # drained meanwhile, or taken by a rescan: nothing to hand out
        if inbox.blocked(now):
            return None  # parked, or its retry is not due: the rescan or a timer takes it later
        inbox.due = None
        owner = new_owner()
        token = table.grant(key, owner, now + lock_ttl)
        entry = None
        if with_entry:
            head = inbox.entries[0]
            head.attempts += 1
            age = now - head.accepted_at
            entry = InboxEntry(head.id, head.attempts, head.payload, age, len(inbox.entries))
        return InboxGrant(key, owner, token, lock_ttl, entry)

    async def keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys`."""
        table = self.table
        await asyncio.sleep(0)
        with table.mutex:
            now = table.clock()
            return [
                InboxKey(
                    key,
                    len(box.entries),
                    now - box.entries[0].accepted_at if box.entries else 0.0,
                    len(box.dead),
                    max(0.0, box.due - now) if box.due is not None else None,
                    box.parked,
                )
                for key, box in sorted(self.inboxes.items())
            ]

    async def dead_letters(self, key: str) -> list[DeadLetter]:
        """See :meth:`asynclock.state.InboxState.inbox_dead_letters`."""
        table = self.table
        await asyncio.sleep(0)
        with table.mutex:
            inbox = self.inboxes.get(key)
            return list(inbox.dead) if inbox is not None else []

    async def requeue(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_requeue`."""
        table = self.table
        await asyncio.sleep(0)
        with table.mutex:
            inbox = self.inboxes.get(key)
            if inbox is None or not inbox.dead:
                return 0
            now = table.clock()
            moved = [_Entry(d.id, 0, d.payload, now) for d in inbox.dead]
            inbox.entries.extendleft(reversed(moved))
            inbox.dead.clear()
            inbox.parked = False
            if not inbox.blocked(now) and table.live(key, now) is None:
                self.handout.offer(key)
            return len(moved)

    async def discard(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_discard`."""
        table = self.table
        await asyncio.sleep(0)
        with table.mutex:
            inbox = self.inboxes.get(key)
            if inbox is None:
                return 0
            now = table.clock()
            discarded = len(inbox.dead)
            inbox.dead.clear()
            inbox.parked = False
            if not inbox.entries:
                del self.inboxes[key]
            elif not inbox.blocked(now) and table.live(key, now) is None:
                self.handout.offer(key)
            return discarded
