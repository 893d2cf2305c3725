"""MariaDB: the semaphore waiters' ear of a state dies; the waiters fall back, then push again.

The states run as a user of their own with no server privilege (``SQLTarget``), as an
application would: the release's ``KILL QUERY`` reaches the ear because it is a session of the
same user. Killing the ear's whole session (``KILL CONNECTION``) drops its state's push path:
the waiter is woken at once to ask again (it may have missed a release), polls while the ear
is down, and is pushed again once the ear is back (reopened at most once a second).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

from asynclock import Semaphore
from asynclock.state import SemaphoreState
from tests._matrix import MYSQL, require
from tests.faults._sql import SQLTarget
from tests.faults._timing import bounded, report, until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.faults._sql import AnySQLState

pytestmark = [pytest.mark.mysql, pytest.mark.timeout(60)]

OP_TIMEOUT = 0.5
#: a waiter whose ear died is served within this of the release (it polls meanwhile: 100 ms
#: at most between looks, plus a loaded machine's margin)
PROMPT = 0.6
#: a pushed handoff
PUSHED = 0.05


@pytest.fixture
async def sql() -> AsyncIterator[SQLTarget]:
    require(MYSQL)
    target = SQLTarget(MYSQL)
    await target.start()
    try:
        yield target
    finally:
        await target.aclose()


def permits(state: AnySQLState) -> SemaphoreState:
    assert isinstance(state, SemaphoreState)
    return state


async def handoff(holder: AnySQLState, waiter: AnySQLState, key: str) -> float:
    """Seconds from the holder's release to the other state's waiter taking the permit."""
    permit = Semaphore(holder, key, limit=1, ttl=10.0)
    assert await permit.acquire(blocking=False)
    entered: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def wait() -> None:
        async with Semaphore(waiter, key, limit=1, ttl=10.0, timeout=10.0):
            entered.set_result(time.monotonic())

    waiting = asyncio.create_task(wait())
    for _ in range(1000):
        if (await permits(holder).semaphore_inspect(key)).waiting:
            break
        await asyncio.sleep(0.005)
    released = time.monotonic()
    await permit.release()
    await waiting
    return entered.result() - released


async def test_a_killed_ear_falls_back_to_polling_and_pushes_again(sql: SQLTarget) -> None:
    a = sql.open(op_timeout=OP_TIMEOUT, connect_timeout=OP_TIMEOUT)
    b = sql.open(op_timeout=OP_TIMEOUT, connect_timeout=OP_TIMEOUT)
    try:
        assert await handoff(a, b, "k") < 1.0  # b's ear is open
        permit = Semaphore(a, "k", limit=1, ttl=10.0)
        assert await permit.acquire(blocking=False)
        entered: asyncio.Future[float] = asyncio.get_running_loop().create_future()

        async def wait() -> None:
            async with Semaphore(b, "k", limit=1, ttl=10.0, timeout=10.0):
                entered.set_result(time.monotonic())

        waiting = asyncio.create_task(wait())
        ears: set[int] = set()

        async def ear_waits() -> bool:
            ears.update(await sql.running("asynclock-semaphore-ear"))
            return len(ears) == 1 and (await permits(b).semaphore_inspect("k")).waiting == 1

        await until(ear_waits, "b's ear to wait and its waiter to queue", within=5.0)
        (ear,) = ears
        await sql.kill(ear)
        await asyncio.sleep(0.05)  # the waiter, woken by the lost ear, asks again and polls
        released = time.monotonic()
        await permit.release()
        delay = await bounded(entered, "the waiter", 5.0) - released
        await waiting
        assert delay <= PROMPT, f"served {delay:.2f} s after the release"

        fast: list[float] = []

        async def pushed_again() -> bool:
            fast.append(await handoff(a, b, "k"))
            return fast[-1] < PUSHED

        await until(pushed_again, "a pushed handoff after the kill", within=10.0)
        report("semaphore-ear-kill", served_after=delay, pushed=fast[-1], tries=len(fast))
    finally:
        await a.aclose()
        await b.aclose()
