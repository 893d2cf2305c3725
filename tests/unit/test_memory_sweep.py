"""MemoryState forgets expired keys by itself: many distinct keys do not leak."""

from __future__ import annotations

import asyncio

import pytest

from asynclock import AsyncLock, Deduper, LockNotOwnedError, MemoryState
from tests._helpers import FakeClock


async def test_expired_dedupe_records_are_swept_by_later_operations() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    dedupe = Deduper(state, ttl=1.0)
    for i in range(20_000):
        assert await dedupe.first_seen(f"old-{i}")
    assert state.size() == (0, 20_000)
    clock.advance(2.0)
    # new traffic sweeps a bounded batch of expired entries per operation
    for i in range(1_000):
        await dedupe.first_seen(f"new-{i}")
    assert state.size()[1] == 1_000
    assert not state._table.heap or len(state._table.heap) <= 1_000


async def test_expired_locks_are_swept_and_the_heap_stays_bounded() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    leaked = [AsyncLock(state, f"k-{i}", ttl=1.0) for i in range(5_000)]
    for lock in leaked:
        assert await lock.acquire(blocking=False)  # held, never released: they expire
    assert state.size()[0] == 5_000
    clock.advance(2.0)
    for _ in range(200):
        async with AsyncLock(state, "busy", ttl=1.0):
            pass
    assert state.size()[0] == 0
    assert len(state._table.heap) < 100  # 200 acquisitions of one key left no pile of deadlines
    for lock in leaked:
        with pytest.raises(LockNotOwnedError):
            await lock.release()


async def test_steady_churn_of_distinct_keys_stays_flat() -> None:
    clock = FakeClock()
    state = MemoryState(clock=clock)
    dedupe = Deduper(state, ttl=0.5)
    sizes = []
    for second in range(10):
        for i in range(2_000):
            await dedupe.first_seen(f"{second}-{i}")
            clock.advance(0.0005)  # 2,000 ids per simulated second
        sizes.append(state.size()[1])
    # about one TTL's worth of ids is live at any time, whatever the total seen
    assert max(sizes[2:]) <= 1_200, sizes
    await asyncio.sleep(0)
