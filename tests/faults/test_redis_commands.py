"""Server commands per contended cycle on Redis, counted on a server of this test alone.

Not a fault, but it needs the throwaway server of the fault fixtures: ``INFO commandstats`` on
the shared server counts every other test's commands too. A handoff to the next waiter of the
process is one ``EVALSHA`` of ``release.lua`` running ``GET`` and ``SET``: the successor's
abandon mark is read from the lock's value, not by an ``EXISTS`` (#16, docs/decisions.md).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.asyncio import Redis

    from asynclock import RedisState

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

TASKS, CYCLES = 4, 50


async def _commands(admin: Redis) -> Counter[str]:
    stats = await admin.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()})


async def test_a_contended_cycle_costs_three_commands(
    open_state: Callable[..., RedisState], admin: Redis
) -> None:
    state = open_state()
    async with AsyncLock(state, "warm", ttl=10.0):  # scripts loaded, connections open
        pass
    before = await _commands(admin)

    async def worker() -> None:
        for _ in range(CYCLES):
            async with AsyncLock(state, "k", ttl=30.0):  # no renewal in a short body
                await asyncio.sleep(0)  # the others queue behind the holder meanwhile

    await asyncio.gather(*(worker() for _ in range(TASKS)))
    spent = await _commands(admin) - before
    spent.pop("info", None)
    cycles = TASKS * CYCLES
    # the first acquire (EVALSHA, GET, EXISTS, TIME, SET), then one release per cycle: a
    # handoff (EVALSHA, GET, SET) but for the last one, which frees the key and PUBLISHes
    assert spent == Counter(
        evalsha=cycles + 1, get=cycles + 1, set=cycles + 1, exists=1, time=1, publish=1
    ), spent
    assert sum(spent.values()) == 3 * cycles + 6
