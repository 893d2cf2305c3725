"""``MemoryState`` shared by event loops running in different threads of one process (SPEC 1)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from asynclock import AsyncLock, Deduper, MemoryState

THREADS = 3


class TestMemoryStateAcrossThreads:
    def test_one_holder_across_event_loops(self) -> None:
        state = MemoryState()
        guard = threading.Lock()
        inside = 0
        most_inside = 0
        entries = 0

        async def worker() -> None:
            nonlocal inside, most_inside, entries
            for _ in range(20):
                async with AsyncLock(state, "k", ttl=10.0, timeout=30.0):
                    with guard:
                        inside += 1
                        most_inside = max(most_inside, inside)
                    await asyncio.sleep(0.001)
                    with guard:
                        inside -= 1
                        entries += 1

        with ThreadPoolExecutor(THREADS) as pool:
            futures = [pool.submit(asyncio.run, worker()) for _ in range(THREADS)]
            for future in futures:
                future.result(timeout=60)
        assert most_inside == 1
        assert entries == THREADS * 20

    def test_waiter_in_another_loop_is_woken_by_release(self) -> None:
        state = MemoryState()
        held = threading.Event()
        release = threading.Event()

        async def holder() -> None:
            async with AsyncLock(state, "k", ttl=30.0):
                held.set()
                await asyncio.to_thread(release.wait, 30)

        async def waiter() -> float:
            lock = AsyncLock(state, "k", ttl=30.0)
            loop = asyncio.get_running_loop()
            start = loop.time()
            loop.call_later(0.2, release.set)  # the holder lets go while we wait
            assert await lock.acquire(timeout=20.0)
            waited = loop.time() - start
            await lock.release()
            return waited

        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(asyncio.run, holder())
            assert held.wait(30)
            second = pool.submit(asyncio.run, waiter())
            waited = second.result(timeout=60)
            first.result(timeout=60)
        # Woken by the release in the other thread's loop, not by the 30 s TTL.
        assert waited < 5.0

    def test_first_seen_exactly_once_across_event_loops(self) -> None:
        state = MemoryState()
        ids = [f"evt-{n}" for n in range(100)]

        async def worker() -> list[str]:
            dedupe = Deduper(state)
            answers = await asyncio.gather(*(dedupe.first_seen(i) for i in ids))
            return [i for i, fresh in zip(ids, answers, strict=True) if fresh]

        with ThreadPoolExecutor(THREADS) as pool:
            results = [pool.submit(asyncio.run, worker()) for _ in range(THREADS)]
            counts = Counter(i for future in results for i in future.result(timeout=60))
        assert counts == Counter(ids)
