"""Entry points of the OS processes that ``conformance/test_semaphore_processes.py`` spawns.

As ``tests/_workers.py``: each process builds its own state from the URL and options it is
given, runs its own event loop, and reports a plain dict through a queue (an ``"error"`` entry
with the traceback when something failed). The shared count of holders lives in the plain Redis
server of the test matrix (one ``INCR``/``DECR`` per critical section, whichever backend the
semaphore is on): a store every process reaches, outside the backend under test.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from asynclock import Semaphore, state_from_url
from tests._workers import BARRIER_TIMEOUT
from tests.support.processes import report_back

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier, Event

#: INCR the count of holders and keep its largest value seen, atomically: returns the count
ENTER = """
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def limit_worker(
    url: str,
    options: dict[str, object],
    key: str,
    limit: int,
    counter_url: str,
    counter_key: str,
    tasks: int,
    rounds: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """``tasks`` tasks take a permit of ``key`` ``rounds`` times each; the holders are counted
    in ``counter_key`` (and its largest value in ``counter_key:max``) on ``counter_url``."""
    report_back(
        results,
        _limit(url, options, key, limit, counter_url, counter_key, tasks, rounds, barrier),
    )


async def _limit(
    url: str,
    options: dict[str, object],
    key: str,
    limit: int,
    counter_url: str,
    counter_key: str,
    tasks: int,
    rounds: int,
    barrier: Barrier,
) -> dict[str, Any]:
    from redis.asyncio import Redis

    counter = Redis.from_url(counter_url)
    enter = counter.register_script(ENTER)
    state = state_from_url(url, **options)
    tokens: list[int] = []
    most = 0
    try:
        await state.inspect(key)  # connected before the start line
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)

        async def task() -> None:
            nonlocal most
            for _ in range(rounds):
                async with Semaphore(state, key, limit=limit, ttl=10.0, timeout=60.0) as permit:
                    inside = int(await enter(keys=[counter_key, f"{counter_key}:max"]))
                    most = max(most, inside)
                    await asyncio.sleep(0.003)
                    await counter.decr(counter_key)
                    assert permit.token is not None
                    tokens.append(permit.token)

        await asyncio.gather(*(task() for _ in range(tasks)))
    finally:
        await state.aclose()
        await counter.aclose()
    return {"tokens": tokens, "most_inside": most, "pid": os.getpid()}


def holding_worker(
    url: str,
    options: dict[str, object],
    key: str,
    limit: int,
    ttl: float,
    held: Event,
    results: Queue[dict[str, Any]],
) -> None:
    """Take every permit of ``key``, say so through ``held``, and hang until killed."""
    report_back(results, _hold(url, options, key, limit, ttl, held))


async def _hold(
    url: str, options: dict[str, object], key: str, limit: int, ttl: float, held: Event
) -> dict[str, Any]:
    state = state_from_url(url, **options)
    permits = [Semaphore(state, key, limit=limit, ttl=ttl) for _ in range(limit)]
    for permit in permits:
        assert await permit.acquire(blocking=False)
    held.set()
    await asyncio.sleep(3600)  # SIGKILLed long before
    return {"pid": os.getpid()}


def waiting_worker(
    url: str,
    options: dict[str, object],
    key: str,
    limit: int,
    number: int,
    results: Queue[dict[str, Any]],
) -> None:
    """Wait for a permit of ``key``; report when it was granted, with its token."""
    report_back(results, _wait(url, options, key, limit, number))


async def _wait(
    url: str, options: dict[str, object], key: str, limit: int, number: int
) -> dict[str, Any]:
    state = state_from_url(url, **options)
    try:
        async with Semaphore(state, key, limit=limit, ttl=10.0, timeout=60.0) as permit:
            granted = time.monotonic()
            await asyncio.sleep(0.05)
            token = permit.token
    finally:
        await state.aclose()
    return {"number": number, "token": token, "granted": granted, "pid": os.getpid()}
