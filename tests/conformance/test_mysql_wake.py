"""MySQL/MariaDB: a release in another state (another process) wakes a waiter by push.

Two MySQLStates share nothing in the process (no local wake-up between them), exactly like two
processes: the waiter hears the release only through the server, through the holder's wake
name (``asynclock/state/mysql/_wake.py``). Polling alone cannot pass the latency bound here: a
holder that keeps the key ``HOLD`` seconds leaves the waiter's back-off at 40-100 ms, so a
release is seen tens of milliseconds late (65 ms median measured with the bell silenced; the
bound is 25 ms, the push path gives ~4 ms).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, MySQLState
from tests._matrix import MYSQL, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.mysql, pytest.mark.timeout(60)]

#: seconds the holder keeps the key before releasing it: long enough for polling to slow down
HOLD = 0.2
HANDOFFS = 20
#: median handoff latency bound, loose for a loaded machine; polling gives ~65 ms here
MEDIAN_BOUND = 0.025


@pytest.fixture
async def two_states() -> AsyncIterator[tuple[MySQLState, MySQLState]]:
    require(MYSQL)
    namespace = uuid.uuid4().hex
    options = MYSQL.options(namespace)
    holder = MySQLState.from_url(MYSQL.url, **options)  # type: ignore[arg-type]
    waiter = MySQLState.from_url(MYSQL.url, **options)  # type: ignore[arg-type]
    try:
        yield holder, waiter
    finally:
        await holder.aclose()
        await waiter.aclose()
        await purge_namespace(MYSQL, namespace)


async def handoff(holder: MySQLState, waiter: MySQLState, key: str) -> float:
    """Seconds from the holder's release to the waiting state's acquire."""
    holding, go = asyncio.Event(), asyncio.Event()

    async def hold() -> float:
        async with AsyncLock(holder, key, ttl=10.0):
            holding.set()
            await go.wait()
            return time.perf_counter()  # the release runs on the way out

    async def wait() -> float:
        async with AsyncLock(waiter, key, ttl=10.0, timeout=5.0):
            return time.perf_counter()

    held = asyncio.create_task(hold())
    await holding.wait()
    waited = asyncio.create_task(wait())
    await asyncio.sleep(HOLD)
    go.set()
    released_from = await held
    return await waited - released_from


async def test_a_release_in_another_state_wakes_the_waiter_at_once(
    two_states: tuple[MySQLState, MySQLState],
) -> None:
    holder, waiter = two_states
    # the first handoff teaches the holder's state that another state waits for the key (its
    # release found the waiter's flag); from the next one on, its bell rings
    await handoff(holder, waiter, "k")
    latencies = [await handoff(holder, waiter, "k") for _ in range(HANDOFFS)]
    median = statistics.median(latencies)
    assert median < MEDIAN_BOUND, f"median handoff {median * 1000:.1f} ms: {latencies}"
