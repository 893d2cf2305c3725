"""Several OS processes sharing one server: exclusion and exactly-once dedupe across processes.

Each process (multiprocessing *spawn*: a fresh interpreter) builds its own state from the URL and
runs its own event loop; see ``tests/_workers.py`` and ``tests/support/processes.py``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, Deduper
from tests import _workers
from tests._matrix import TEST_PREFIX
from tests.support.processes import run_processes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from asynclock import State
    from tests.conftest import Target

pytestmark = pytest.mark.processes

PROCESSES = 3


async def server_counters(url: str, keys: Sequence[str]) -> list[int | None]:
    """The values of counter ``keys`` on the lock server itself (``None``: never written)."""
    client = _workers.redis_client(url)
    try:
        values = [await client.get(key) for key in keys]  # one GET each: any slot
    finally:
        await client.aclose()
    return [None if value is None else int(value) for value in values]


class TestLockAcrossProcesses:
    async def test_one_holder_across_processes(
        self, server_target: Target, server_state: State, key: str
    ) -> None:
        # A counter on the server itself, INCR on entry and DECR on exit (Redis and Redis
        # Cluster: there the counter lives on whichever master owns its slot).
        counter_key = (
            f"{TEST_PREFIX}{server_target.namespace}:counter"
            if server_target.backend.name in _workers.REDIS_BACKENDS
            else None
        )
        tasks, rounds = 2, 10
        args = (server_target.url, server_target.options, key, counter_key, tasks, rounds)
        reports = await run_processes([(_workers.lock_worker, args)] * PROCESSES)

        intervals = sorted(itertools.chain.from_iterable(r["intervals"] for r in reports))
        assert len(intervals) == PROCESSES * tasks * rounds
        overlaps = [
            (a, b) for a, b in itertools.pairwise(intervals) if b[0] < a[1]
        ]  # next one started before the previous one ended
        assert not overlaps, overlaps[:5]
        tokens = [token for _, _, token, _ in intervals]
        assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
        assert len({pid for *_, pid in intervals}) == PROCESSES
        if counter_key is not None:
            assert max(r["most_inside"] for r in reports) == 1
            assert await server_counters(server_target.url, [counter_key]) == [0]
        assert not await AsyncLock(server_state, key).locked()


class TestDedupeAcrossProcesses:
    async def test_first_seen_exactly_once_across_processes(
        self, server_target: Target, server_state: State
    ) -> None:
        ids = [f"evt-{n}" for n in range(200)]
        reports = await run_processes(
            [
                (_workers.dedupe_worker, (server_target.url, server_target.options, ids, n))
                for n in range(PROCESSES)
            ]
        )
        counts = Counter(itertools.chain.from_iterable(r["fresh"] for r in reports))
        assert set(counts) == set(ids)
        assert {event_id: n for event_id, n in counts.items() if n != 1} == {}
        # And the parent, a fourth client, sees them all as duplicates.
        dedupe = Deduper(server_state, ttl=600.0, namespace="procs")
        assert not any([await dedupe.first_seen(event_id) for event_id in ids[:20]])
