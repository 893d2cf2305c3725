"""``kill -9`` of a worker process that holds locks and has claimed dedupe records.

The worker (``_crash_worker.py``, a spawned interpreter: a real OS process) takes auto-renewed
locks and claims dedupe ids, says so, and is then killed with SIGKILL: no ``finally``, no
release, no goodbye. The survivors must take every lock over within the TTL: the renewals
stop with the process, so each lock expires at most ``ttl`` after its last renewal.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, Deduper
from tests.faults import _crash_worker
from tests.faults._timing import bounded, until
from tests.support.processes import spawned
from tests.support.reporting import report

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from redis.asyncio import Redis

    from asynclock import RedisState
    from tests.faults._server import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.processes, pytest.mark.timeout(60)]

TTL = 1.5
MARGIN = 0.3
KEYS = [f"thread-{n}" for n in range(5)]
EVENTS = [f"evt-{n}" for n in range(5)]
#: a spawned interpreter imports asynclock and redis first: slow on a loaded machine
SPAWN_BOUND = 30.0


@pytest.fixture
async def killed_worker(
    redis_server: RedisServer, admin: Redis, prefix: str, open_state: Callable[..., RedisState]
) -> AsyncIterator[float]:
    """Start the worker, wait until it holds everything, SIGKILL it; yields the kill time."""
    ready = multiprocessing.get_context("spawn").Event()
    async with spawned(
        _crash_worker.hold_until_killed, redis_server.url, prefix, KEYS, EVENTS, TTL, ready
    ) as proc:
        assert await asyncio.to_thread(ready.wait, SPAWN_BOUND), "the worker never held its locks"
        probe = open_state()
        for key in KEYS:
            info = await probe.inspect(key)
            assert info is not None, f"{key} is not held"
            assert info.owner.split(":")[1] == str(proc.pid)
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        await asyncio.to_thread(proc.join, 10.0)
        assert proc.exitcode == -signal.SIGKILL
        yield killed_at


async def test_survivors_take_every_lock_over_within_the_ttl(
    killed_worker: float, open_state: Callable[..., RedisState]
) -> None:
    state = open_state()

    async def take_over(key: str) -> tuple[float, int]:
        lock = AsyncLock(state, key, ttl=5.0, timeout=TTL + 3.0)
        assert await lock.acquire()
        taken_at = time.monotonic()
        token = lock.token or 0
        await lock.release()
        return taken_at - killed_worker, token

    takeovers = await bounded(
        asyncio.gather(*(take_over(key) for key in KEYS)), "the takeovers", TTL + 5.0
    )
    delays = [delay for delay, _ in takeovers]
    assert max(delays) <= TTL + MARGIN, f"takeover delays {delays}"
    report(
        "kill-9",
        ttl=TTL,
        locks=len(KEYS),
        takeover_min=min(delays),
        takeover_max=max(delays),
    )


async def test_redelivery_after_kill_is_processed_within_the_lease(
    killed_worker: float, open_state: Callable[..., RedisState]
) -> None:
    dedupe = Deduper(open_state(), ttl=600.0, namespace="events")

    fresh: set[str] = set()

    async def all_fresh() -> bool:
        # a redelivery is processed: its id is fresh again (claimed here, as a survivor would)
        for event_id in set(EVENTS) - fresh:
            if await dedupe.first_seen(event_id):
                fresh.add(event_id)
        return fresh == set(EVENTS)

    await until(all_fresh, "the redelivered events to be fresh", within=TTL + MARGIN)
