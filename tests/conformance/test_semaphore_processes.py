"""``Semaphore`` across OS processes on every server backend (issue #29).

Spawned interpreters (``tests/_semaphore_workers.py``) share one semaphore through their own
states: the limit is never exceeded (counted in a store every process reaches), a SIGKILLed
holder's permits free after their TTL, and waiters of different processes are served in
arrival order.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from asynclock import Semaphore
from asynclock.state import SemaphoreState
from tests import _semaphore_workers
from tests._helpers import eventually
from tests._matrix import REDIS, TEST_PREFIX, require
from tests.support.processes import run_processes

if TYPE_CHECKING:
    from asynclock import State
    from tests.conftest import Target

pytestmark = [pytest.mark.processes, pytest.mark.slow]

PROCESSES = 3
TASKS = 8
LIMIT = 3


def permits(state: State) -> SemaphoreState:
    assert isinstance(state, SemaphoreState)
    return state


async def test_the_limit_holds_across_processes(
    server_target: Target, server_state: State, key: str
) -> None:
    require(REDIS)  # the shared count lives on the plain Redis server
    counter_key = f"{TEST_PREFIX}{server_target.namespace}:holders"
    rounds = 4
    args = (
        server_target.url,
        server_target.options,
        key,
        LIMIT,
        REDIS.url,
        counter_key,
        TASKS,
        rounds,
    )
    reports = await run_processes([(_semaphore_workers.limit_worker, args)] * PROCESSES)
    counter = Redis.from_url(REDIS.url)
    try:
        now, most = await counter.get(counter_key), await counter.get(f"{counter_key}:max")
        await counter.delete(counter_key, f"{counter_key}:max")
    finally:
        await counter.aclose()
    assert int(now) == 0  # every holder left: no drift
    assert 1 <= int(most) <= LIMIT
    assert max(r["most_inside"] for r in reports) <= LIMIT
    tokens = list(itertools.chain.from_iterable(r["tokens"] for r in reports))
    assert len(tokens) == PROCESSES * TASKS * rounds
    assert len(set(tokens)) == len(tokens)  # one token per permit, never reused
    info = await permits(server_state).semaphore_inspect(key)
    assert info.holders == ()
    assert info.waiting == 0


async def test_a_killed_holders_permits_free_after_their_ttl(
    server_target: Target, server_state: State, key: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    held = ctx.Event()
    results: Any = ctx.Queue()
    ttl, limit = 1.5, 2
    proc = ctx.Process(
        target=_semaphore_workers.holding_worker,
        args=(server_target.url, server_target.options, key, limit, ttl, held, results),
        daemon=True,
    )
    proc.start()
    try:
        assert await asyncio.to_thread(held.wait, 60.0), "the holder never took its permits"
        taken_by = time.monotonic()
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.join, 10.0)
        assert not await Semaphore(server_state, key, limit=limit).acquire(blocking=False)
        mine = [
            Semaphore(server_state, key, limit=limit, ttl=10.0, timeout=ttl + 5.0)
            for _ in range(limit)
        ]
        for permit in mine:
            assert await permit.acquire()
        freed = time.monotonic() - taken_by
        # not before the TTL (nobody gave them back) and soon after it (no waiting for anything)
        assert ttl - 0.3 < freed < ttl + 2.0, freed
        info = await permits(server_state).semaphore_inspect(key)
        assert {h.owner for h in info.holders} == {p.owner for p in mine}
        for permit in mine:
            await permit.release()
    finally:
        if proc.is_alive():
            proc.kill()
        results.close()
        results.join_thread()


async def test_waiters_of_other_processes_are_served_in_arrival_order(
    server_target: Target, server_state: State, key: str
) -> None:
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    holder = Semaphore(server_state, key, limit=1, ttl=30.0)
    await holder.acquire()
    procs = []
    try:
        for number in range(PROCESSES):
            proc = ctx.Process(
                target=_semaphore_workers.waiting_worker,
                args=(server_target.url, server_target.options, key, 1, number, results),
                daemon=True,
            )
            proc.start()
            procs.append(proc)

            async def queued(count: int = number + 1) -> bool:
                return (await permits(server_state).semaphore_inspect(key)).waiting >= count

            await eventually(queued, within=60.0, interval=0.01)  # this one has its place
        await holder.release()
        reports = [await asyncio.to_thread(results.get, True, 60.0) for _ in procs]
    finally:
        for proc in procs:
            proc.join(10.0)
            if proc.is_alive():
                proc.kill()
        results.close()
        results.join_thread()
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, "\n".join(errors)
    by_token = sorted(reports, key=lambda r: r["token"])
    assert [r["number"] for r in by_token] == list(range(PROCESSES))
    assert holder.token is not None
    assert by_token[0]["token"] > holder.token
