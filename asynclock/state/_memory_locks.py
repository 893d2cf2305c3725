"""MemoryState's locks and dedupe records: the tables, their mutex, and the steps without I/O.

:class:`LockTable` is the part of :class:`~asynclock.MemoryState` that every lock and dedupe
operation goes through: the tables, the one ``threading.Lock`` that guards them (and the inbox,
``_memory_inbox.py``, whose steps take a key's lock), the token counter and the amortised expiry
sweep. Its ``*_now`` methods are the bodies of MemoryState's async steps without the yield and
the argument checks: the :class:`~asynclock.state._immediate.ImmediateSteps` that AsyncLock and
EventDispatcher call on their lean path (docs/decisions.md, "A lean path on MemoryState"),
which check their arguments once and yield once themselves before calling one. Same atomicity:
each is one step under the mutex.

Every method whose name does not end in ``_now`` expects the caller to hold :attr:`mutex`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from asynclock.state._protocol import ClaimingState, Grant, Release, State

if TYPE_CHECKING:
    from collections.abc import Callable

    from asynclock.state._watch import EventWatch

__all__ = ["Held", "LockTable"]


class _ClaimingState(State, ClaimingState, Protocol):
    """What the state's class offers: the async steps whose bodies the ``*_now`` methods are."""


#: expired entries removed per operation by the amortised sweep
_SWEEP_BUDGET = 32

#: the two answers of a release without handoff (immutable: shared rather than made per call)
_RELEASED = Release(owned=True)
_NOT_OWNED = Release(owned=False)


@dataclass(slots=True)
class Held:
    """A held lock: its owner, fencing token and expiry (by the state's clock)."""

    owner: str
    token: int
    expires_at: float
    # id of an event loop (another "process line") whose blocking waiter asked for a turn
    flagged_by: int = 0


class LockTable:
    """The locks, dedupe records and release watchers of one MemoryState, under one mutex.

    Invariants: fencing tokens come from one counter, so they strictly increase per key; an
    expired entry is dropped on access, or by the sweep (a heap of deadlines, a few entries per
    operation, rebuilt when stale deadlines outnumber live entries).

    Args:
        clock: the state's monotonic clock.
        state_type: the state's class, and ``own_steps`` the async steps the ``*_now`` methods
            are the bodies of (as that class defined them): :meth:`steps_are_own` compares them.
    """

    __slots__ = (
        "claim_owners",
        "clock",
        "dedupe",
        "heap",
        "locks",
        "mutex",
        "own_steps",
        "state_type",
        "tokens",
        "watchers",
    )

    def __init__(
        self,
        clock: Callable[[], float],
        state_type: type[_ClaimingState],
        own_steps: tuple[object, ...],
    ) -> None:
        self.clock = clock
        self.mutex = threading.Lock()
        self.locks: dict[str, Held] = {}
        self.dedupe: dict[str, float] = {}
        #: the owner of each dedupe record made by acquire_claimed (for forget_claimed)
        self.claim_owners: dict[str, str] = {}
        self.heap: list[tuple[float, bool, str]] = []  # (deadline, is_lock, key)
        self.watchers: dict[str, set[EventWatch]] = {}
        self.tokens = itertools.count(1)
        self.state_type = state_type
        self.own_steps = own_steps

    # -- the tables (mutex held) ---------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Drop a bounded batch of expired entries (the amortised sweep)."""
        heap = self.heap
        if not heap or heap[0][0] > now:  # nothing expired: the common case
            return
        for _ in range(_SWEEP_BUDGET):
            if not heap or heap[0][0] > now:
                return
            _, is_lock, key = heapq.heappop(heap)
            if is_lock:
                held = self.locks.get(key)
                if held is not None and held.expires_at <= now:
                    del self.locks[key]
            else:
                expires_at = self.dedupe.get(key)
                if expires_at is not None and expires_at <= now:
                    del self.dedupe[key]
                    self.claim_owners.pop(key, None)

    def live(self, key: str, now: float) -> Held | None:
        """``key``'s lock unless it expired (an expired one is dropped)."""
        held = self.locks.get(key)
        if held is not None and held.expires_at <= now:
            del self.locks[key]
            return None
        return held

    def grant(self, key: str, owner: str, expires_at: float, *, sweep: bool = True) -> int:
        """Give ``key``'s lock to ``owner`` with a new token; ``sweep=False``: see :meth:`add`."""
        token = next(self.tokens)
        self.locks[key] = Held(owner, token, expires_at)
        if sweep:
            self.schedule(expires_at, True, key)
        return token

    def schedule(self, expires_at: float, is_lock: bool, key: str) -> None:
        """Remember a deadline for the sweep; keeps the heap in proportion to live entries."""
        heap = self.heap
        heapq.heappush(heap, (expires_at, is_lock, key))
        live = len(self.locks) + len(self.dedupe)
        if len(heap) > 2 * live + 64:
            # released and re-extended entries leave stale deadlines behind (a hot key pushes
            # one per acquisition): rebuild from what is live, amortised O(1) per push
            heap[:] = [(held.expires_at, True, k) for k, held in self.locks.items()]
            heap.extend((deadline, False, k) for k, deadline in self.dedupe.items())
            heapq.heapify(heap)

    def wake(self, watchers: set[EventWatch] | None) -> None:
        """Wake ``watchers`` (a key's release watchers), across threads if need be."""
        if not watchers:
            return
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for watch in watchers:
            watch.notify(current)

    def take(self, key: str, owner: str, ttl: float, now: float, *, waiting: bool) -> Grant:
        """The body of ``acquire``."""
        held = self.live(key, now)
        if held is None:
            return Grant(self.grant(key, owner, now + ttl))
        if held.owner == owner:
            return Grant(held.token)
        if waiting and not held.flagged_by:
            held.flagged_by = id(asyncio.get_running_loop())
        return Grant(None, held.expires_at - now)

    def add(
        self, key: str, now: float, ttl: float, owner: str | None = None, *, sweep: bool = True
    ) -> bool:
        """The body of ``dedupe_add``; ``owner`` for a claim (forget_claimed).

        ``sweep=False`` (also for :meth:`grant`): the caller is bound to replace or delete the
        entry itself, so its deadline need not go on the sweep's heap (it still expires on
        access).
        """
        expires_at = self.dedupe.get(key)
        if expires_at is not None and expires_at > now:
            return False
        self.dedupe[key] = now + ttl
        if owner is None:
            self.claim_owners.pop(key, None)
        else:
            self.claim_owners[key] = owner
        if sweep:
            self.schedule(now + ttl, False, key)
        return True

    def keep(self, key: str, now: float, expires_at: float) -> None:
        """Set the record's expiry, keeping its owner; one that is gone is made without."""
        previous = self.dedupe.get(key)
        if previous is None or previous <= now:
            self.claim_owners.pop(key, None)
        self.dedupe[key] = expires_at
        self.schedule(expires_at, False, key)

    def release(
        self,
        key: str,
        owner: str,
        successor: str | None,
        ttl: float | None,
        now: float,
        swept: bool = True,
    ) -> Release:
        """The body of ``release`` (a handoff to ``successor`` unless another loop flagged the
        key); ``swept=False``: the successor's lock stays off the sweep's heap."""
        held = self.locks.get(key)  # (live(), inline: on every release)
        if held is not None and held.expires_at <= now:
            del self.locks[key]
            held = None
        if held is None or held.owner != owner:
            return _NOT_OWNED
        flagged = held.flagged_by  # (the loop is looked up only once a loop flagged it)
        if successor is not None and (flagged == 0 or flagged == id(asyncio.get_running_loop())):
            assert ttl is not None
            return Release(True, self.grant(key, successor, now + ttl, sweep=swept))
        del self.locks[key]
        watchers = self.watchers.get(key)
        if watchers:
            self.wake(watchers)
        return _RELEASED

    # -- the immediate steps (ImmediateSteps: each takes the mutex) ----------------------------

    def steps_are_own(self) -> bool:
        """Whether the state's async steps are MemoryState's own (see ImmediateSteps).

        Instrumentation (a test's spy, a fault injected for a test) replaces them on the class,
        and a subclass may override them; the lean path must then go through them like every
        other path.
        """
        cls = self.state_type
        acquire, acquire_claimed, release, release_claimed, dedupe_add, dedupe_keep = self.own_steps
        return (
            cls.acquire is acquire
            and cls.acquire_claimed is acquire_claimed
            and cls.release is release
            and cls.release_claimed is release_claimed
            and cls.dedupe_add is dedupe_add
            and cls.dedupe_keep is dedupe_keep
        )

    def acquire_now(self, key: str, owner: str, ttl: float) -> Grant:
        """``acquire(key, owner, ttl)`` without its yield (the caller yielded)."""
        with self.mutex:
            now = self.clock()
            self.sweep(now)
            return self.take(key, owner, ttl, now, waiting=False)

    def token_now(self, key: str, owner: str, ttl: float) -> int | None:
        """``acquire_now`` answering only the token (``None``: busy), for AsyncLock's lean path."""
        with self.mutex:
            now = self.clock()
            self.sweep(now)
            held = self.live(key, now)
            if held is None:
                return self.grant(key, owner, now + ttl)
            return held.token if held.owner == owner else None

    def acquire_claimed_now(
        self, key: str, owner: str, ttl: float, claim: str, claim_ttl: float
    ) -> Grant | None:
        """``acquire_claimed`` without its yield (the caller yielded)."""
        with self.mutex:
            now = self.clock()
            self.sweep(now)
            if not self.add(claim, now, claim_ttl, owner):
                return None
            return self.take(key, owner, ttl, now, waiting=False)

    def claim_and_acquire_now(
        self, key: str, owner: str, ttl: float, claim: str | None, claim_ttl: float
    ) -> int | None:
        """``acquire_claimed`` (``acquire`` without ``claim``) for the dispatcher's lean path.

        Returns the fencing token; ``0`` when the key is busy, which records nothing (the lean
        path then hands over to the general one, which asks again); ``None`` for a duplicate.

        Neither the lock nor the claim goes on the sweep's heap: the lean path releases the
        lock and marks the claim done (or forgets it) itself before the dispatch returns, and
        a renewal (past ``lock_ttl / 3``) schedules what it extends, as every renewal does.
        """
        with self.mutex:
            now = self.clock()
            heap = self.heap
            if heap and heap[0][0] <= now:  # (sweep()'s own first check, without the call)
                self.sweep(now)
            held = self.locks.get(key)
            if held is not None and held.expires_at <= now:  # (live(), inline)
                del self.locks[key]
                held = None
            if held is not None and held.owner != owner:
                return 0
            if claim is not None and not self.add(claim, now, claim_ttl, owner, sweep=False):
                return None
            if held is not None:
                return held.token
            return self.grant(key, owner, now + ttl, sweep=False)

    def claim_now(self, claim: str, owner: str, ttl: float) -> bool:
        """``dedupe_add`` of ``owner``'s claim (``forget_claimed`` can undo it) without its yield.

        Not put on the sweep's heap, as ``claim_and_acquire_now``'s claim: the queued event
        marks it done or forgets it before its dispatch returns, and a lease renewal schedules
        what it extends.
        """
        with self.mutex:
            now = self.clock()
            self.sweep(now)
            return self.add(claim, now, ttl, owner, sweep=False)

    def keep_now(self, claim: str, ttl: float) -> None:
        """``dedupe_keep`` without its yield: the claim of a folded (``latest``) event marked
        done by its dispatch as it returns."""
        with self.mutex:
            now = self.clock()
            self.keep(claim, now, now + ttl)

    def release_now(
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
        renewed by the lean path itself, as ``claim_and_acquire_now``'s)."""
        with self.mutex:
            now = self.clock()
            if claim is not None:
                self.keep(claim, now, now + claim_ttl)
            return self.release(key, owner, successor, ttl, now, swept)
