"""MemoryState's semaphores (:class:`~asynclock.state.SemaphoreState`), in this process's memory.

A table of its own beside MemoryState's locks: semaphore keys are a namespace of their own, so
one mutex here serves every semaphore operation and none of them waits for a lock operation.
Wake-ups are direct: a release sets the event of the waiters it made eligible (across threads
when their loops differ), never a broadcast.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asynclock.state._protocol import Grant, LockInfo, SemaphoreInfo
from asynclock.state._watch import EventWatch

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

__all__ = ["MemorySemaphores"]

#: expired holders or places dropped per operation by the amortised sweep
_SWEEP_BUDGET = 32


@dataclass(slots=True)
class _Place:
    limit: int
    until: float


@dataclass(slots=True)
class _Semaphore:
    #: owner -> (token, expires at)
    holders: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: owner -> its place; insertion order is arrival order
    queue: dict[str, _Place] = field(default_factory=dict)


def eligible(held: int, queue: list[tuple[str, int]]) -> list[str]:
    """The waiters at the head of ``queue`` (owner, limit) that may take a permit now, with
    ``held`` permits taken: each, and every one ahead of it, fits ``held + position < limit``."""
    found: list[str] = []
    for position, (owner, limit) in enumerate(queue):
        if held + position >= limit:
            break
        found.append(owner)
    return found


class MemorySemaphores:
    """The semaphores of one :class:`~asynclock.MemoryState`.

    Invariants: every operation is one step under one mutex (atomic against the tasks and
    threads of the process), after one yield and never later, so an acquire cannot land after
    its caller gave it up; expiry follows ``clock``; tokens come from one counter, so they
    strictly increase per key; a key with no holder and no place is forgotten.
    """

    __slots__ = ("_clock", "_heap", "_mutex", "_semaphores", "_tokens", "_watchers")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._mutex = threading.Lock()
        self._semaphores: dict[str, _Semaphore] = {}
        self._heap: list[tuple[float, str]] = []  # (a deadline, key): for the sweep
        self._watchers: dict[tuple[str, str], set[EventWatch]] = {}
        self._tokens = itertools.count(1)

    # -- internals (call with the mutex held) ------------------------------------------------

    def _live(self, key: str, now: float) -> _Semaphore | None:
        """``key``'s semaphore with its expired holders and places dropped (``None``: none)."""
        semaphore = self._semaphores.get(key)
        if semaphore is None:
            return None
        gone = [owner for owner, (_, expires) in semaphore.holders.items() if expires <= now]
        for owner in gone:
            del semaphore.holders[owner]
        late = [owner for owner, place in semaphore.queue.items() if place.until <= now]
        for owner in late:
            del semaphore.queue[owner]
        return semaphore

    def _forget_if_idle(self, key: str, semaphore: _Semaphore) -> None:
        if not semaphore.holders and not semaphore.queue:
            self._semaphores.pop(key, None)

    def _sweep(self, now: float) -> None:
        heap = self._heap
        for _ in range(_SWEEP_BUDGET):
            if not heap or heap[0][0] > now:
                return
            _, key = heapq.heappop(heap)
            semaphore = self._live(key, now)
            if semaphore is not None:
                self._forget_if_idle(key, semaphore)
        if len(heap) > 2 * len(self._semaphores) + 64:
            # extended permits and renewed places leave stale deadlines: rebuild
            heap[:] = [
                (deadline, key)
                for key, semaphore in self._semaphores.items()
                for deadline in (
                    *(expires for _, expires in semaphore.holders.values()),
                    *(place.until for place in semaphore.queue.values()),
                )
            ]
            heapq.heapify(heap)

    def _order(self, semaphore: _Semaphore) -> list[tuple[str, int]]:
        return [(owner, place.limit) for owner, place in semaphore.queue.items()]

    def _wake_new(self, key: str, semaphore: _Semaphore, before: list[str]) -> None:
        """Wake the waiters eligible now that were not before this step."""
        now_eligible = eligible(len(semaphore.holders), self._order(semaphore))
        fresh = [owner for owner in now_eligible if owner not in before]
        if not fresh:
            return
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        for owner in fresh:
            for watch in self._watchers.get((key, owner), ()):
                watch.notify(current)

    def _retry_after(self, semaphore: _Semaphore, ahead: list[str], now: float) -> float:
        """Seconds until the first permit held, or place kept ahead of the caller, expires."""
        ends = [expires for _, expires in semaphore.holders.values()]
        ends += [semaphore.queue[owner].until for owner in ahead]
        return max(min(ends) - now, 0.0) if ends else 0.0

    # -- SemaphoreState ---------------------------------------------------------------------

    async def acquire(
        self, key: str, owner: str, limit: int, ttl: float, hold: float | None
    ) -> Grant:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_acquire`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            self._sweep(now)
            semaphore = self._live(key, now)
            if semaphore is None:
                semaphore = self._semaphores[key] = _Semaphore()
            held = semaphore.holders.get(owner)
            if held is not None:  # a repeated call that won already: the same token, re-armed
                semaphore.holders[owner] = (held[0], now + ttl)
                heapq.heappush(self._heap, (now + ttl, key))
                return Grant(held[0])
            order = self._order(semaphore)
            queued = owner in semaphore.queue
            position = next(i for i, (o, _) in enumerate(order) if o == owner) if queued else None
            ahead = order[:position] if position is not None else order
            fits = eligible(len(semaphore.holders), [*ahead, (owner, limit)])
            if len(fits) == len(ahead) + 1:
                semaphore.queue.pop(owner, None)
                token = next(self._tokens)
                semaphore.holders[owner] = (token, now + ttl)
                heapq.heappush(self._heap, (now + ttl, key))
                return Grant(token)
            if hold is not None:
                semaphore.queue[owner] = _Place(limit, now + hold)
                heapq.heappush(self._heap, (now + hold, key))
            else:
                self._forget_if_idle(key, semaphore)
            return Grant(None, self._retry_after(semaphore, [o for o, _ in ahead], now))

    async def release(self, key: str, owner: str) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_release`."""
        await asyncio.sleep(0)
        with self._mutex:
            return self._give_back(key, owner, dequeue=False)

    def _give_back(self, key: str, owner: str, *, dequeue: bool) -> bool:
        now = self._clock()
        semaphore = self._live(key, now)
        if semaphore is None:
            return False
        before = eligible(len(semaphore.holders), self._order(semaphore))
        owned = semaphore.holders.pop(owner, None) is not None
        if dequeue:
            semaphore.queue.pop(owner, None)
        self._wake_new(key, semaphore, before)
        self._forget_if_idle(key, semaphore)
        return owned

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_abandon`.

        An acquire here acts right after its single yield and never later, so an abandoned one
        cannot land afterwards: give the permit back and leave the queue.
        """
        await asyncio.sleep(0)
        with self._mutex:
            self._give_back(key, owner, dequeue=True)

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_extend`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            semaphore = self._live(key, now)
            held = semaphore.holders.get(owner) if semaphore is not None else None
            if semaphore is None or held is None:
                return False
            semaphore.holders[owner] = (held[0], now + ttl)
            heapq.heappush(self._heap, (now + ttl, key))
            return True

    async def inspect(self, key: str) -> SemaphoreInfo:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_inspect`."""
        await asyncio.sleep(0)
        with self._mutex:
            now = self._clock()
            semaphore = self._live(key, now)
            if semaphore is None:
                return SemaphoreInfo(key, (), 0)
            holders = sorted(
                (
                    LockInfo(key, owner, expires - now, token)
                    for owner, (token, expires) in semaphore.holders.items()
                ),
                key=lambda info: info.token,
            )
            return SemaphoreInfo(key, tuple(holders), len(semaphore.queue))

    @asynccontextmanager
    async def watch(self, key: str, owner: str) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_watch`."""
        watch = EventWatch(asyncio.get_running_loop())
        where = (key, owner)
        with self._mutex:
            self._watchers.setdefault(where, set()).add(watch)
        try:
            yield watch
        finally:
            with self._mutex:
                watchers = self._watchers.get(where)
                if watchers is not None:
                    watchers.discard(watch)
                    if not watchers:
                        del self._watchers[where]

    def size(self) -> int:
        """Semaphore keys stored (with a holder or a place, expired ones until swept)."""
        return len(self._semaphores)
