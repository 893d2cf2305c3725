"""MemoryState: locks and dedupe records in this process's memory.

The embedded default: no server, no dependency. Safe across the tasks of one event loop and
across event loops running in different threads of one process (one ``threading.Lock`` guards
every table, and wake-ups cross threads with ``call_soon_threadsafe``). Not shared between
processes: use a server state for that.

Size: one class, over 500 lines on purpose. It implements every capability a server state
has (locks, claims, the inbox with its batches, the admin listing) under the one mutex that
makes it atomic; split over several modules, each table would be guarded from afar.
"""

from __future__ import annotations

import asyncio
import fnmatch
import heapq
import itertools
import threading
import time
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asynclock._errors import LockNotOwnedError
from asynclock._owner import new_owner
from asynclock._validate import (
    check_inbox_finish,
    check_key,
    check_limit,
    check_permits,
    check_ttl,
)
from asynclock.state._base import ClosesOnExit
from asynclock.state._lines import Lines
from asynclock.state._memory_handout import Handout, MemoryWorker
from asynclock.state._memory_semaphores import MemorySemaphores
from asynclock.state._protocol import (
    DeadLetter,
    Grant,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxGrant,
    InboxKey,
    LockInfo,
    Release,
    SemaphoreInfo,
)
from asynclock.state._watch import EventWatch, TokenWatch

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Collection, Sequence
    from contextlib import AbstractAsyncContextManager


#: expired entries removed per operation by the amortised sweep
_SWEEP_BUDGET = 32


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


#: the two answers of a release without handoff (immutable: shared rather than made per call)
_RELEASED = Release(owned=True)
_NOT_OWNED = Release(owned=False)


@dataclass(slots=True)
class _Held:
    owner: str
    token: int
    expires_at: float
    # id of an event loop (another "process line") whose blocking waiter asked for a turn
    flagged_by: int = 0


class MemoryState(ClosesOnExit):
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
        "_claim_owners",
        "_clock",
        "_closed",
        "_dedupe",
        "_handout",
        "_heap",
        "_inboxes",
        "_lines",
        "_locks",
        "_mutex",
        "_semaphores",
        "_supersede_carried",
        "_supersede_watchers",
        "_tokens",
        "_watchers",
    )

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self._clock: Callable[[], float] = clock or time.monotonic
        self._mutex = threading.Lock()
        self._locks: dict[str, _Held] = {}
        self._dedupe: dict[str, float] = {}
        #: the owner of each dedupe record made by acquire_claimed (for forget_claimed)
        self._claim_owners: dict[str, str] = {}
        self._heap: list[tuple[float, bool, str]] = []  # (deadline, is_lock, key)
        self._watchers: dict[str, set[EventWatch]] = {}
        #: SupersedeSignals: the holders' subscriptions, per key
        self._supersede_watchers: dict[str, set[TokenWatch]] = {}
        #: SupersedeSignals: the events left for each key's next call, (expiry, payload) each
        self._supersede_carried: dict[str, list[tuple[float, str]]] = {}
        #: the durable inbox (durable for this process's life only: it is memory)
        self._inboxes: dict[str, _Inbox] = {}
        #: the inbox's hand-out: keys with work and no holder, and the workers waiting for one
        self._handout = Handout()
        self._lines = Lines()  # FairState: the per-key lines of fair retries
        self._tokens = itertools.count(1)
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
        return f"<MemoryState locks={len(self._locks)} dedupe={len(self._dedupe)}>"

    async def aclose(self) -> None:
        """Mark the state closed; entries stay readable (nothing to disconnect)."""
        self._closed = True
        await asyncio.sleep(0)

    # -- internals (call with the mutex held) ------------------------------------------------

    def _sweep(self, now: float) -> None:
        heap = self._heap
        if not heap or heap[0][0] > now:  # nothing expired: the common case
            return
        for _ in range(_SWEEP_BUDGET):
            if not heap or heap[0][0] > now:
                return
            _, is_lock, key = heapq.heappop(heap)
            if is_lock:
                held = self._locks.get(key)
                if held is not None and held.expires_at <= now:
                    del self._locks[key]
            else:
                expires_at = self._dedupe.get(key)
                if expires_at is not None and expires_at <= now:
                    del self._dedupe[key]
                    self._claim_owners.pop(key, None)

    def _live(self, key: str, now: float) -> _Held | None:
        held = self._locks.get(key)
        if held is not None and held.expires_at <= now:
            del self._locks[key]
            return None
        return held

    def _grant(self, key: str, owner: str, expires_at: float, *, sweep: bool = True) -> int:
        token = next(self._tokens)
        self._locks[key] = _Held(owner, token, expires_at)
        if sweep:
            self._schedule(expires_at, True, key)
        return token

    def _schedule(self, expires_at: float, is_lock: bool, key: str) -> None:
        """Remember a deadline for the sweep; keeps the heap in proportion to live entries."""
        heap = self._heap
        heapq.heappush(heap, (expires_at, is_lock, key))
        live = len(self._locks) + len(self._dedupe)
        if len(heap) > 2 * live + 64:
            # released and re-extended entries leave stale deadlines behind (a hot key pushes
            # one per acquisition): rebuild from what is live, amortised O(1) per push
            heap[:] = [(held.expires_at, True, k) for k, held in self._locks.items()]
            heap.extend((deadline, False, k) for k, deadline in self._dedupe.items())
            heapq.heapify(heap)

    def _notify(self, key: str) -> None:
        self._wake(self._watchers.get(key))

    def _wake(self, watchers: set[EventWatch] | None) -> None:
        if not watchers:
            return
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for watch in watchers:
            watch.notify(current)

    # -- the State protocol -------------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire`."""
        check_key(key)
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        if not waiting:
            return self._acquire_now(key, owner, ttl)
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            return self._take(key, owner, ttl, now, waiting=True)

    # The ``*_now`` methods are the bodies of their async namesakes, without the yield and the
    # argument checks: for AsyncLock and EventDispatcher, which check their arguments once and
    # yield once themselves (the yield rule) before calling one, on their lean path for exactly
    # this class (see docs/decisions.md, "A lean path on MemoryState"). Same atomicity: each is
    # one step under the mutex.

    def _steps_are_own(self) -> bool:
        """Whether this class's async steps are MemoryState's own (see ImmediateSteps).

        Instrumentation (a test's spy, a fault injected for a test) replaces them on the class,
        and a subclass may override them; the lean path must then go through them like every
        other path.
        """
        cls = type(self)
        acquire, acquire_claimed, release, release_claimed, dedupe_add, dedupe_keep = _OWN_STEPS
        return (
            cls.acquire is acquire
            and cls.acquire_claimed is acquire_claimed
            and cls.release is release
            and cls.release_claimed is release_claimed
            and cls.dedupe_add is dedupe_add
            and cls.dedupe_keep is dedupe_keep
        )

    def _acquire_now(self, key: str, owner: str, ttl: float) -> Grant:
        """``acquire(key, owner, ttl)`` without its yield (the caller yielded)."""
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            return self._take(key, owner, ttl, now, waiting=False)

    def _token_now(self, key: str, owner: str, ttl: float) -> int | None:
        """``_acquire_now`` answering only the token (``None``: busy), for AsyncLock's lean path."""
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            held = self._live(key, now)
            if held is None:
                return self._grant(key, owner, now + ttl)
            return held.token if held.owner == owner else None

    def _acquire_claimed_now(
        self, key: str, owner: str, ttl: float, claim: str, claim_ttl: float
    ) -> Grant | None:
        """``acquire_claimed`` without its yield (the caller yielded)."""
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            if not self._add(claim, now, claim_ttl, owner):
                return None
            return self._take(key, owner, ttl, now, waiting=False)

    def _claim_and_acquire_now(
        self, key: str, owner: str, ttl: float, claim: str | None, claim_ttl: float
    ) -> int | None:
        """``acquire_claimed`` (``acquire`` without ``claim``) for the dispatcher's lean path.

        Returns the fencing token; ``0`` when the key is busy, which records nothing (the lean
        path then hands over to the general one, which asks again); ``None`` for a duplicate.

        Neither the lock nor the claim goes on the sweep's heap: the lean path releases the
        lock and marks the claim done (or forgets it) itself before the dispatch returns, and
        a renewal (past ``lock_ttl / 3``) schedules what it extends, as every renewal does.
        """
        with self._mutex:
            now = self._clock()
            heap = self._heap
            if heap and heap[0][0] <= now:  # (_sweep's own first check, without the call)
                self._sweep(now)
            held = self._locks.get(key)
            if held is not None and held.expires_at <= now:  # (_live, inline)
                del self._locks[key]
                held = None
            if held is not None and held.owner != owner:
                return 0
            if claim is not None and not self._add(claim, now, claim_ttl, owner, sweep=False):
                return None
            if held is not None:
                return held.token
            return self._grant(key, owner, now + ttl, sweep=False)

    def _claim_now(self, claim: str, owner: str, ttl: float) -> bool:
        """``dedupe_add`` of ``owner``'s claim (``forget_claimed`` can undo it) without its yield.

        Not put on the sweep's heap, as ``_claim_and_acquire_now``'s claim: the queued event
        marks it done or forgets it before its dispatch returns, and a lease renewal schedules
        what it extends.
        """
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            return self._add(claim, now, ttl, owner, sweep=False)

    def _keep_now(self, claim: str, ttl: float) -> None:
        """``dedupe_keep`` without its yield: the claim of a folded (``latest``) event marked
        done by its dispatch as it returns."""
        with self._mutex:
            now = self._clock()
            self._keep(claim, now, now + ttl)

    def _release_now(
        self,
        key: str,
        owner: str,
        claim: str | None = None,
        claim_ttl: float = 0.0,
        successor: str | None = None,
        ttl: float | None = None,
        swept: bool = True,
    ) -> Release:
        """``release`` (``release_claimed`` with ``claim``) without its yield; ``swept=False``:
        the successor's lock is not put on the sweep's heap (a lean hold's, released or
        renewed by the lean path itself, as ``_claim_and_acquire_now``'s)."""
        with self._mutex:
            now = self._clock()
            if claim is not None:
                self._keep(claim, now, now + claim_ttl)
            return self._release(key, owner, successor, ttl, now, swept)

    async def acquire_claimed(
        self, key: str, owner: str, ttl: float, *, claim: str, claim_ttl: float
    ) -> Grant | None:
        """See :meth:`asynclock.state.ClaimingState.acquire_claimed`."""
        await asyncio.sleep(0)
        return self._acquire_claimed_now(key, owner, ttl, claim, claim_ttl)

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
            self._sweep(now)

            def remaining() -> float | None:
                held = self._live(key, now)
                return None if held is None else held.expires_at - now

            return self._lines.take(
                key,
                turn,
                hold,
                now,
                lambda: self._take(key, owner, ttl, now, waiting=False),
                remaining,
            )

    async def fair_leave(self, key: str, turn: str) -> None:
        """See :meth:`asynclock.state.FairState.fair_leave`."""
        await asyncio.sleep(0)
        with self._mutex:
            self._lines.leave(key, turn)

    def _take(self, key: str, owner: str, ttl: float, now: float, *, waiting: bool) -> Grant:
        """The body of ``acquire``, under the mutex."""
        held = self._live(key, now)
        if held is None:
            return Grant(self._grant(key, owner, now + ttl))
        if held.owner == owner:
            return Grant(held.token)
        if waiting and not held.flagged_by:
            held.flagged_by = id(asyncio.get_running_loop())
        return Grant(None, held.expires_at - now)

    def _add(
        self, key: str, now: float, ttl: float, owner: str | None = None, *, sweep: bool = True
    ) -> bool:
        """The body of ``dedupe_add``, under the mutex; ``owner`` for a claim (forget_claimed).

        ``sweep=False`` (also for ``_grant``): the caller is bound to replace or delete the entry
        itself, so its deadline need not go on the sweep's heap (it still expires on access).
        """
        expires_at = self._dedupe.get(key)
        if expires_at is not None and expires_at > now:
            return False
        self._dedupe[key] = now + ttl
        if owner is None:
            self._claim_owners.pop(key, None)
        else:
            self._claim_owners[key] = owner
        if sweep:
            self._schedule(now + ttl, False, key)
        return True

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release`."""
        await asyncio.sleep(0)
        with self._mutex:
            return self._release(key, owner, successor, ttl, self._clock())

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
            self._keep(claim, now, now + claim_ttl)
            return self._release(key, owner, successor, ttl, now)

    def _release(
        self,
        key: str,
        owner: str,
        successor: str | None,
        ttl: float | None,
        now: float,
        swept: bool = True,
    ) -> Release:
        held = self._locks.get(key)  # (_live, inline: on every release)
        if held is not None and held.expires_at <= now:
            del self._locks[key]
            held = None
        if held is None or held.owner != owner:
            return _NOT_OWNED
        flagged = held.flagged_by  # (the loop is looked up only once a loop flagged it)
        if successor is not None and (flagged == 0 or flagged == id(asyncio.get_running_loop())):
            assert ttl is not None
            return Release(True, self._grant(key, successor, now + ttl, sweep=swept))
        del self._locks[key]
        watchers = self._watchers.get(key)
        if watchers:
            self._wake(watchers)
        return _RELEASED

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.State.abandon`.

        In memory an acquire acts right after its single yield and never later, so an abandoned
        acquire cannot land afterwards: release, and withdraw this loop's waiting flag.
        """
        await self.release(key, owner)
        with self._mutex:
            held = self._live(key, self._clock())
            if held is not None and held.flagged_by == id(asyncio.get_running_loop()):
                held.flagged_by = 0

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.extend`."""
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            held = self._live(key, now)
            if held is None or held.owner != owner:
                return False
            held.expires_at = now + ttl
            self._schedule(held.expires_at, True, key)
            return True

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            held = self._live(key, now)
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
            self._sweep(now)
            return self._add(key, now, ttl)

    async def dedupe_keep(self, key: str, ttl: float) -> None:
        """See :meth:`asynclock.state.State.dedupe_keep`."""
        check_key(key)
        check_ttl(ttl, key=key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._keep(key, now, now + ttl)

    def _keep(self, key: str, now: float, expires_at: float) -> None:
        """Set the record's expiry, keeping its owner; one that is gone is made without."""
        previous = self._dedupe.get(key)
        if previous is None or previous <= now:
            self._claim_owners.pop(key, None)
        self._dedupe[key] = expires_at
        self._schedule(expires_at, False, key)

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget`."""
        await asyncio.sleep(0)
        with self._mutex:
            self._claim_owners.pop(key, None)
            expires_at = self._dedupe.pop(key, None)
            return expires_at is not None and expires_at > self._clock()

    async def dedupe_remaining(self, key: str) -> float | None:
        """See :meth:`asynclock.state.DedupeReading.dedupe_remaining`."""
        await asyncio.sleep(0)
        with self._mutex:
            expires_at = self._dedupe.get(key)
            now = self._clock()
            return None if expires_at is None or expires_at <= now else expires_at - now

    async def forget_claimed(self, claim: str, owner: str) -> bool:
        """See :meth:`asynclock.state.ClaimingState.forget_claimed`."""
        await asyncio.sleep(0)
        with self._mutex:
            expires_at = self._dedupe.get(claim)
            if expires_at is None or expires_at <= self._clock():
                return False
            if self._claim_owners.get(claim) != owner:
                return False
            del self._dedupe[claim], self._claim_owners[claim]
            return True

    @asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.State.watch`."""
        watch = EventWatch(asyncio.get_running_loop())
        with self._mutex:
            self._watchers.setdefault(key, set()).add(watch)
        try:
            yield watch
        finally:
            with self._mutex:
                watchers = self._watchers.get(key)
                if watchers is not None:
                    watchers.discard(watch)
                    if not watchers:
                        del self._watchers[key]

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
                for key, held in self._locks.items()
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

    # -- the inbox (InboxState) ----------------------------------------------------------------

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
        check_key(key)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            inbox = self._inboxes.get(key)
            pending = len(inbox.entries) if inbox is not None else 0
            if claim is not None:
                expires_at = self._dedupe.get(claim)
                if expires_at is not None and expires_at > now:
                    return InboxAccepted("duplicate", pending)
            if pending >= max_pending:
                return InboxAccepted("full", pending)
            if claim is not None:
                self._add(claim, now, claim_ttl)
            if inbox is None:
                inbox = self._inboxes[key] = _Inbox()
            inbox.entries.append(_Entry(inbox.next_id, 0, payload, now))
            inbox.next_id += 1
            # else the holder's next step takes the entry, or the key waits (retry, parked)
            if not inbox.blocked(now) and self._live(key, now) is None:
                self._handout.offer(key)
            return InboxAccepted("accepted", pending + 1)

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
        wait = check_inbox_finish(key, done=done, dead=dead, retry_in=retry_in, park=park)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            held = self._live(key, now)
            if held is None or held.owner != owner:
                raise LockNotOwnedError(key, owner)
            inbox = self._inboxes.get(key)
            if wait is not None or park:
                finished = (done,) if done is not None else ()
                self._set_aside(key, owner, inbox, finished, dead, wait, now)
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
            if inbox is not None and not inbox.dead:
                del self._inboxes[key]
            self._release(key, owner, None, None, now)
            return None

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
        check_limit(limit)
        finished = frozenset(done)
        wait = check_inbox_finish(key, done=finished, dead=dead, retry_in=retry_in, park=park)
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            held = self._live(key, now)
            if held is None or held.owner != owner:
                raise LockNotOwnedError(key, owner)
            inbox = self._inboxes.get(key)
            if wait is not None or park:
                self._set_aside(key, owner, inbox, finished, dead, wait, now)
                return None
            if inbox is None:
                self._release(key, owner, None, None, now)
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
            if not inbox.dead:
                del self._inboxes[key]
            self._release(key, owner, None, None, now)
            return None

    def _set_aside(
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
        if inbox is None:  # (nothing pending: the step found its entry gone, as done= would)
            inbox = self._inboxes[key] = _Inbox()
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
            del self._inboxes[key]  # (a retry of an entry gone already: nothing waits)
        self._release(key, owner, None, None, now)

    async def inbox_ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            waiting = [
                (b.entries[0].accepted_at, k)
                for k, b in self._inboxes.items()
                if b.entries and not b.blocked(now) and self._live(k, now) is None
            ]
        return [key for _, key in sorted(waiting)]

    @asynccontextmanager
    async def inbox_worker(
        self, *, lock_ttl: float, with_entry: bool
    ) -> AsyncIterator[MemoryWorker]:
        """See :meth:`asynclock.state.InboxState.inbox_worker` (``_memory_handout.py``)."""
        check_ttl(lock_ttl, "lock_ttl")
        worker = MemoryWorker(
            self._handout, self._mutex, lambda key: self._hand_out(lock_ttl, with_entry, key)
        )
        try:
            yield worker
        finally:
            worker.close()

    def _hand_out(self, lock_ttl: float, with_entry: bool, key: str | None) -> InboxGrant | None:
        """Take ``key`` (``None``: the oldest offered key that still has work and no holder):
        its lock for a fresh owner, and its head handed out with ``with_entry`` (call with the
        mutex held)."""
        if key is not None:
            return self._take_key(key, lock_ttl, with_entry)
        while (offered := self._handout.pop()) is not None:
            grant = self._take_key(offered, lock_ttl, with_entry)
            if grant is not None:
                return grant
        return None

    def _take_key(self, key: str, lock_ttl: float, with_entry: bool) -> InboxGrant | None:
        """``key``'s grant if it has work and no holder, else ``None`` (mutex held)."""
        now = self._clock()
        inbox = self._inboxes.get(key)
        if inbox is None or not inbox.entries or self._live(key, now) is not None:
            return None  # drained meanwhile, or taken by a rescan: nothing to hand out
        if inbox.blocked(now):
            return None  # parked, or its retry is not due: the rescan or a timer takes it later
        inbox.due = None
        owner = new_owner()
        token = self._grant(key, owner, now + lock_ttl)
        entry = None
        if with_entry:
            head = inbox.entries[0]
            head.attempts += 1
            age = now - head.accepted_at
            entry = InboxEntry(head.id, head.attempts, head.payload, age, len(inbox.entries))
        return InboxGrant(key, owner, token, lock_ttl, entry)

    async def inbox_keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            return [
                InboxKey(
                    key,
                    len(box.entries),
                    now - box.entries[0].accepted_at if box.entries else 0.0,
                    len(box.dead),
                    max(0.0, box.due - now) if box.due is not None else None,
                    box.parked,
                )
                for key, box in sorted(self._inboxes.items())
            ]

    async def inbox_dead_letters(self, key: str) -> list[DeadLetter]:
        """See :meth:`asynclock.state.InboxState.inbox_dead_letters`."""
        await asyncio.sleep(0)
        with self._mutex:
            inbox = self._inboxes.get(key)
            return list(inbox.dead) if inbox is not None else []

    async def inbox_requeue(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_requeue`."""
        await asyncio.sleep(0)
        with self._mutex:
            inbox = self._inboxes.get(key)
            if inbox is None or not inbox.dead:
                return 0
            now = self._clock()
            moved = [_Entry(d.id, 0, d.payload, now) for d in inbox.dead]
            inbox.entries.extendleft(reversed(moved))
            inbox.dead.clear()
            inbox.parked = False
            if not inbox.blocked(now) and self._live(key, now) is None:
                self._handout.offer(key)
            return len(moved)

    async def inbox_discard(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_discard`."""
        await asyncio.sleep(0)
        with self._mutex:
            inbox = self._inboxes.get(key)
            if inbox is None:
                return 0
            now = self._clock()
            discarded = len(inbox.dead)
            inbox.dead.clear()
            inbox.parked = False
            if not inbox.entries:
                del self._inboxes[key]
            elif not inbox.blocked(now) and self._live(key, now) is None:
                self._handout.offer(key)
            return discarded

    def size(self) -> tuple[int, int]:
        """``(locks, dedupe records)`` currently stored, expired ones included until swept."""
        return len(self._locks), len(self._dedupe)


#: the async steps whose bodies the lean path calls directly (the ``*_now`` methods)
_OWN_STEPS = (
    MemoryState.acquire,
    MemoryState.acquire_claimed,
    MemoryState.release,
    MemoryState.release_claimed,
    MemoryState.dedupe_add,  # (as _claim_now)
    MemoryState.dedupe_keep,  # (as _keep_now)
)
