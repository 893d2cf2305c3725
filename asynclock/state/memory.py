"""MemoryState: locks and dedupe records in this process's memory.

The embedded default: no server, no dependency. Safe across the tasks of one event loop and
across event loops running in different threads of one process (one ``threading.Lock`` guards
every table, and wake-ups cross threads with ``call_soon_threadsafe``). Not shared between
processes: use a server state for that.

The tables live in internal objects, each in a module of its own: the locks and dedupe records
with their mutex and the steps without I/O (``_memory_locks.py``), the inbox
(``_memory_inbox.py``, under the same mutex), the semaphores (``_memory_semaphores.py``). This
class is the public face: it checks arguments, yields once, and runs one step.

Size: just over 500 lines: one short method per operation of every capability the state
offers (locks, dedupe, claims, fair lines, the inbox, supersede signals, semaphores), each
passing on to its table.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from asynclock._validate import check_key, check_permits, check_ttl
from asynclock.state._base import ClosesOnExit
from asynclock.state._immediate import OffersImmediateSteps
from asynclock.state._lines import Lines
from asynclock.state._memory_inbox import MemoryInbox
from asynclock.state._memory_locks import LockTable
from asynclock.state._memory_semaphores import MemorySemaphores
from asynclock.state._protocol import LockInfo
from asynclock.state._watch import EventWatch, TokenWatch

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Sequence
    from contextlib import AbstractAsyncContextManager

    from asynclock.state._memory_handout import MemoryWorker
    from asynclock.state._protocol import (
        DeadLetter,
        Grant,
        InboxAccepted,
        InboxBatch,
        InboxEntry,
        InboxKey,
        Release,
        SemaphoreInfo,
    )


class MemoryState(OffersImmediateSteps, ClosesOnExit):
    """Locks and dedupe records in this process's memory (the embedded default).

    Invariants:

    * Operations are atomic against every task and thread of this process.
    * Expiry uses ``clock`` (``time.monotonic`` by default), so wall-clock jumps never grant a
      lock twice. Expired entries are dropped lazily on access and by an amortised sweep (a heap
      of deadlines, a few entries per operation, rebuilt when stale deadlines outnumber live
      entries), so a million distinct keys, or one key acquired a million times, do not leak.
    * Fencing tokens come from one counter per state, so they strictly increase per key.
    * Every method yields to the event loop once before it acts and never after, so a
      cancellation can only land before the operation: it is either done or not started.

    Args:
        clock: a monotonic clock in seconds; tests may inject a fake one.

    Example:
        A fake clock lets a test expire a lock without waiting for it:

        >>> import asyncio
        >>> from asynclock import AsyncLock, MemoryState
        >>> now = 0.0
        >>> state = MemoryState(clock=lambda: now)
        >>> async def main():
        ...     global now
        ...     first = AsyncLock(state, "contact:42", ttl=30.0)
        ...     await first.acquire()
        ...     now += 31.0                                   # past its TTL
        ...     second = AsyncLock(state, "contact:42", ttl=30.0)
        ...     return await second.acquire(blocking=False), second.token > first.token
        >>> asyncio.run(main())
        (True, True)
    """

    __slots__ = (
        "__weakref__",
        "_clock",
        "_closed",
        "_inbox",
        "_lines",
        "_mutex",
        "_semaphores",
        "_supersede_carried",
        "_supersede_watchers",
        "_table",
    )

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        #: the locks and dedupe records, their mutex, and the steps without I/O (the lean path's)
        self._table = table = LockTable(clock or time.monotonic, type(self), _OWN_STEPS)
        super().__init__(table)
        self._clock = table.clock
        self._mutex = table.mutex
        #: SupersedeSignals: the holders' subscriptions, per key
        self._supersede_watchers: dict[str, set[TokenWatch]] = {}
        #: SupersedeSignals: the events left for each key's next call, (expiry, payload) each
        self._supersede_carried: dict[str, list[tuple[float, str]]] = {}
        #: the durable inbox (durable for this process's life only: it is memory)
        self._inbox = MemoryInbox(table)
        self._lines = Lines()  # FairState: the per-key lines of fair retries
        #: SemaphoreState: a table of its own (semaphore keys are a namespace of their own)
        self._semaphores = MemorySemaphores(self._clock)
        self._closed = False

    @classmethod
    def from_url(cls, url: str = "memory://", **options: object) -> MemoryState:
        """Build from ``memory://`` (no options are read from the URL)."""
        if options:
            raise TypeError(f"MemoryState takes no options, got {sorted(options)}")
        return cls()

    def __repr__(self) -> str:
        return f"<MemoryState locks={len(self._table.locks)} dedupe={len(self._table.dedupe)}>"

    async def aclose(self) -> None:
        """Mark the state closed; entries stay readable (nothing to disconnect)."""
        self._closed = True
        await asyncio.sleep(0)

    # -- the State protocol -------------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire`."""
        check_key(key)
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        if not waiting:
            return self._table.acquire_now(key, owner, ttl)
        with self._mutex:
            now = self._clock()
            self._table.sweep(now)
            return self._table.take(key, owner, ttl, now, waiting=True)

    async def acquire_claimed(
        self, key: str, owner: str, ttl: float, *, claim: str, claim_ttl: float
    ) -> Grant | None:
        """See :meth:`asynclock.state.ClaimingState.acquire_claimed`."""
        await asyncio.sleep(0)
        return self._table.acquire_claimed_now(key, owner, ttl, claim, claim_ttl)

    async def fair_acquire(
        self, key: str, owner: str, ttl: float, *, turn: str, hold: float
    ) -> Grant:
        """See :meth:`asynclock.state.FairState.fair_acquire`."""
        check_key(key)
        check_ttl(ttl, key=key)
        check_ttl(hold, "hold", key=key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._table.sweep(now)

            def remaining() -> float | None:
                held = self._table.live(key, now)
                return None if held is None else held.expires_at - now

            return self._lines.take(
                key,
                turn,
                hold,
                now,
                lambda: self._table.take(key, owner, ttl, now, waiting=False),
                remaining,
            )

    async def fair_leave(self, key: str, turn: str) -> None:
        """See :meth:`asynclock.state.FairState.fair_leave`."""
        await asyncio.sleep(0)
        with self._mutex:
            self._lines.leave(key, turn)

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release`."""
        await asyncio.sleep(0)
        with self._mutex:
            return self._table.release(key, owner, successor, ttl, self._clock())

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
        """See :meth:`asynclock.state.ClaimingState.release_claimed`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._table.keep(claim, now, now + claim_ttl)
            return self._table.release(key, owner, successor, ttl, now)

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.State.abandon`.

        In memory an acquire acts right after its single yield and never later, so an abandoned
        acquire cannot land afterwards: release, and withdraw this loop's waiting flag.
        """
        await self.release(key, owner)
        with self._mutex:
            held = self._table.live(key, self._clock())
            if held is not None and held.flagged_by == id(asyncio.get_running_loop()):
                held.flagged_by = 0

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.extend`."""
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            held = self._table.live(key, now)
            if held is None or held.owner != owner:
                return False
            held.expires_at = now + ttl
            self._table.schedule(held.expires_at, True, key)
            return True

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            held = self._table.live(key, now)
            if held is None:
                return None
            return LockInfo(key, held.owner, held.expires_at - now, held.token)

    async def dedupe_add(self, key: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.dedupe_add`."""
        check_key(key)
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._table.sweep(now)
            return self._table.add(key, now, ttl)

    async def dedupe_keep(self, key: str, ttl: float) -> None:
        """See :meth:`asynclock.state.State.dedupe_keep`."""
        check_key(key)
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._table.keep(key, now, now + ttl)

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget`."""
        await asyncio.sleep(0)
        with self._mutex:
            self._table.claim_owners.pop(key, None)
            expires_at = self._table.dedupe.pop(key, None)
            return expires_at is not None and expires_at > self._clock()

    async def dedupe_remaining(self, key: str) -> float | None:
        """See :meth:`asynclock.state.DedupeReading.dedupe_remaining`."""
        await asyncio.sleep(0)
        with self._mutex:
            expires_at = self._table.dedupe.get(key)
            now = self._clock()
            return None if expires_at is None or expires_at <= now else expires_at - now

    async def forget_claimed(self, claim: str, owner: str) -> bool:
        """See :meth:`asynclock.state.ClaimingState.forget_claimed`."""
        await asyncio.sleep(0)
        with self._mutex:
            expires_at = self._table.dedupe.get(claim)
            if expires_at is None or expires_at <= self._clock():
                return False
            if self._table.claim_owners.get(claim) != owner:
                return False
            del self._table.dedupe[claim], self._table.claim_owners[claim]
            return True

    @asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.State.watch`."""
        watch = EventWatch(asyncio.get_running_loop())
        with self._mutex:
            self._table.watchers.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._mutex:
                watchers = self._table.watchers.get(key)
                if watchers is not None:
                    watchers.discard(watch)
                    if not watchers:
                        del self._table.watchers[key]

    async def supersede(self, key: str, token: int) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede`: a direct call."""
        await asyncio.sleep(0)
        with self._mutex:
            watchers = tuple(self._supersede_watchers.get(key, ()))
        current = asyncio.get_running_loop()
        for watch in watchers:
            watch.deliver(str(token), current)

    @asynccontextmanager
    async def supersede_watch(self, key: str) -> AsyncIterator[TokenWatch]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_watch`."""
        watch = TokenWatch(asyncio.get_running_loop())
        with self._mutex:
            self._supersede_watchers.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._mutex:
                watchers = self._supersede_watchers.get(key)
                if watchers is not None:
                    watchers.discard(watch)
                    if not watchers:
                        del self._supersede_watchers[key]

    async def supersede_carry(self, key: str, events: Sequence[str], ttl: float) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_carry`."""
        check_key(key)
        ttl = check_ttl(ttl)
        await asyncio.sleep(0)
        if not events:
            return
        with self._mutex:
            expires_at = self._clock() + ttl
            carried = self._supersede_carried.setdefault(key, [])
            carried[:] = [(expires_at, payload) for _, payload in carried]
            carried.extend((expires_at, payload) for payload in events)

    async def supersede_collect(self, key: str) -> list[str]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_collect`."""
        check_key(key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            # an expired leftover of another key goes too (nothing else visits them)
            for name in [n for n, c in self._supersede_carried.items() if c and c[0][0] <= now]:
                if name != key:
                    del self._supersede_carried[name]
            carried = self._supersede_carried.pop(key, [])
        return [payload for expires_at, payload in carried if expires_at > now]

    async def held_locks(self, match: str = "*") -> AsyncIterator[LockInfo]:
        """See :meth:`asynclock.state.LockAdmin.held_locks`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            found = [
                LockInfo(key, held.owner, held.expires_at - now, held.token)
                for key, held in self._table.locks.items()
                if held.expires_at > now and fnmatch.fnmatchcase(key, match)
            ]
        for info in found:
            yield info

    async def force_release(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.LockAdmin.force_release`."""
        info = await self.inspect(key)
        if info is None:
            return None
        released = await self.release(key, info.owner)  # in the holder's name: compare first
        return info if released.owned else None

    # -- semaphores (SemaphoreState: _memory_semaphores.py) --------------------------------------

    async def semaphore_acquire(
        self, key: str, owner: str, limit: int, ttl: float, *, hold: float | None = None
    ) -> Grant:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_acquire`."""
        check_key(key)
        check_permits(limit, key=key)
        check_ttl(ttl, key=key)
        if hold is not None:
            check_ttl(hold, "hold", key=key)
        return await self._semaphores.acquire(key, owner, limit, ttl, hold)

    async def semaphore_release(self, key: str, owner: str) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_release`."""
        return await self._semaphores.release(key, owner)

    async def semaphore_abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_abandon`."""
        await self._semaphores.abandon(key, owner)

    async def semaphore_extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_extend`."""
        check_ttl(ttl, key=key)
        return await self._semaphores.extend(key, owner, ttl)

    async def semaphore_inspect(self, key: str) -> SemaphoreInfo:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_inspect`."""
        return await self._semaphores.inspect(key)

    def semaphore_watch(self, key: str, owner: str) -> AbstractAsyncContextManager[EventWatch]:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_watch` (direct wake-ups)."""
        return self._semaphores.watch(key, owner)

    # -- the inbox (InboxState: _memory_inbox.py) ----------------------------------------------

    async def inbox_accept(
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
        """See :meth:`asynclock.state.InboxState.inbox_accept` (kept in this process's memory;
        a key nobody holds is offered to one waiting worker, which takes it in one step)."""
        return await self._inbox.accept(
            key,
            payload,
            claim=claim,
            claim_ttl=claim_ttl,
            max_pending=max_pending,
            lock_ttl=lock_ttl,
            with_entry=with_entry,
        )

    async def inbox_step(
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
        return await self._inbox.step(
            key, owner, done=done, dead=dead, take=take, retry_in=retry_in, park=park
        )

    async def inbox_take(
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
        return await self._inbox.take(
            key, owner, done=done, dead=dead, limit=limit, retry_in=retry_in, park=park
        )

    async def inbox_ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready`."""
        return await self._inbox.ready()

    def inbox_worker(
        self, *, lock_ttl: float, with_entry: bool
    ) -> AbstractAsyncContextManager[MemoryWorker]:
        """See :meth:`asynclock.state.InboxState.inbox_worker` (``_memory_handout.py``)."""
        return self._inbox.worker(lock_ttl=lock_ttl, with_entry=with_entry)

    async def inbox_keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys`."""
        return await self._inbox.keys()

    async def inbox_dead_letters(self, key: str) -> list[DeadLetter]:
        """See :meth:`asynclock.state.InboxState.inbox_dead_letters`."""
        return await self._inbox.dead_letters(key)

    async def inbox_requeue(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_requeue`."""
        return await self._inbox.requeue(key)

    async def inbox_discard(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_discard`."""
        return await self._inbox.discard(key)

    def size(self) -> tuple[int, int]:
        """``(locks, dedupe records)`` currently stored, expired ones included until swept."""
        return len(self._table.locks), len(self._table.dedupe)


#: the async steps whose bodies the lean path calls directly (the ``*_now`` methods)
_OWN_STEPS = (
    MemoryState.acquire,
    MemoryState.acquire_claimed,
    MemoryState.release,
    MemoryState.release_claimed,
    MemoryState.dedupe_add,  # (as claim_now)
    MemoryState.dedupe_keep,  # (as keep_now)
)
