"""MySQL/MariaDB: a semaphore release in another state wakes the waiter it made eligible by push.

Two MySQLStates share nothing in the process (no local wake-up between them), exactly like two
processes: the waiter hears the release only through the server, through its state's ear (a
connection parked in a marked ``GET_LOCK`` that the release's procedure interrupts with ``KILL
QUERY``; ``asynclock/state/mysql/_semaphore_ear.py``). The polling back-off is set to seconds
here, so a waiter that polled would be seen a second or more late: the bounds below are met by
the push alone. The waiting state's statements are counted exactly, through a counting proxy
(``tests/_server_work.py``): a release wakes one waiter (not all of them), and idle waiters cost
nothing but their place renewals (one per ``PLACE_REFRESH`` each), never a poll.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from asynclock import MySQLState, Semaphore
from asynclock._semaphore import contend
from asynclock._semaphore.contend import PLACE_REFRESH
from asynclock.state.mysql import _wake
from asynclock.state.mysql._ear import Anchor
from asynclock.state.mysql._semaphore_ear import SemaphoreEar
from tests._matrix import MYSQL, purge_namespace, require
from tests._server_work import CountingProxy, Record, proxied_url

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.mysql, pytest.mark.timeout(90)]

#: a back-off this long makes a polling waiter late by seconds (the waits are capped by
#: PLACE_REFRESH, 1.7 s): only a push meets the latency bound
SLOW_POLL = 30.0
HANDOFFS = 10
#: median handoff latency bound, loose for a loaded machine (the push path gives a few ms)
MEDIAN_BOUND = 0.05
#: idle waiters of the counted state
WAITERS = 12


class Two:
    """A holder's state and a waiter's state, the waiter's statements counted."""

    def __init__(self, holder: MySQLState, waiter: MySQLState, record: Record) -> None:
        self.holder = holder
        self.waiter = waiter
        self.record = record

    def counted(self, start: float, end: float) -> int:
        return len(self.record.between(start, end))


@pytest.fixture
async def two() -> AsyncIterator[Two]:
    require(MYSQL)
    namespace = uuid.uuid4().hex
    options = MYSQL.options(namespace)
    record = Record()
    proxies: list[CountingProxy] = []
    url = await proxied_url(MYSQL.url, "waiter", record, proxies)
    holder = MySQLState.from_url(MYSQL.url, **options)  # type: ignore[arg-type]
    waiter = MySQLState.from_url(url, **options)  # type: ignore[arg-type]
    try:
        yield Two(holder, waiter, record)
    finally:
        await holder.aclose()
        await waiter.aclose()
        for proxy in proxies:
            await proxy.aclose()
        await purge_namespace(MYSQL, namespace)


async def queued(state: MySQLState, key: str, count: int) -> None:
    """Return once ``count`` waiters have their place in ``key``'s queue."""
    for _ in range(2000):
        if (await state.semaphore_inspect(key)).waiting >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{count} waiters never queued")


async def wait(state: MySQLState, entered: asyncio.Future[float]) -> None:
    """Take a permit of ``k`` (limit 1), telling when."""
    async with Semaphore(state, "k", limit=1, ttl=30.0, timeout=20.0):
        entered.set_result(time.perf_counter())


async def test_a_release_in_another_state_wakes_the_waiter_within_milliseconds(
    two: Two, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wake, "FIRST_POLL", SLOW_POLL)
    monkeypatch.setattr(_wake, "MAX_POLL", SLOW_POLL)
    latencies = []
    for _ in range(HANDOFFS):
        permit = Semaphore(two.holder, "k", limit=1, ttl=30.0)
        assert await permit.acquire(blocking=False)
        entered: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(wait(two.waiter, entered))
        await queued(two.holder, "k", 1)
        await asyncio.sleep(0.2)  # a polling waiter would be deep in its back-off by now
        released = time.perf_counter()
        await permit.release()
        latencies.append(await entered - released)
        await waiting
    median = statistics.median(latencies)
    assert median < MEDIAN_BOUND, f"median handoff {median * 1000:.1f} ms: {latencies}"
    assert max(latencies) < PLACE_REFRESH, latencies  # not one waited for its own re-check


async def test_a_release_wakes_one_waiter_and_idle_waiters_do_not_poll(two: Two) -> None:
    permit = Semaphore(two.holder, "k", limit=1, ttl=30.0)
    assert await permit.acquire(blocking=False)
    won: list[Semaphore] = []
    go = asyncio.Event()

    async def wait() -> None:
        sem = Semaphore(two.waiter, "k", limit=1, ttl=30.0, timeout=60.0)
        async with sem:
            won.append(sem)
            await go.wait()

    tasks = [asyncio.create_task(wait()) for _ in range(WAITERS)]
    try:
        await queued(two.holder, "k", WAITERS)
        # idle: the waiters wait for a push; each renews its place once per PLACE_REFRESH (the
        # default back-off of a polling waiter, 100 ms, would cost 30 statements each here)
        start = time.time()
        window = 2 * PLACE_REFRESH
        await asyncio.sleep(window)
        idle = two.counted(start, time.time())
        renewals = WAITERS * 3  # at most 3 renewals each in two periods (phase), 1 ear a 5 s
        assert idle <= renewals + 2, f"{idle} statements in {window:.1f} s of idle waiting"
        # one release: the waiting state runs the ear's collect, its next wait, and the woken
        # waiter's acquire; the eleven others are not woken (they would ask again: 11 more)
        await asyncio.sleep(0.3)  # clear of the renewals that followed the window
        released = time.time()
        await permit.release()
        for _ in range(2000):
            if won:
                break
            await asyncio.sleep(0.001)
        assert len(won) == 1
        granted = time.time()
        await asyncio.sleep(0.2)
        woken = two.counted(released, time.time())
        assert woken <= 4, f"{woken} statements after one release"
        assert granted - released < PLACE_REFRESH / 2
    finally:
        go.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_collect_interrupted_by_a_second_kill_wakes_every_waiter(two: Two) -> None:
    """Two releases ring one ear at once: the second kill lands on the ear's collect.

    The collect (a transaction) may have deleted marks it could not answer: the ear rolls it
    back and wakes every semaphore waiter of its state, and keeps its connection.
    """
    connect = two.holder._connect_dedicated
    heard: list[str] = []
    anchor = Anchor(connect, op_timeout=10.0)
    ear = SemaphoreEar(
        connect,
        (
            (
                "SELECT 'asynclock-semaphore-ear', IF(0, 1, CASE GET_LOCK(%(anchor)s, %(wait)s) "
                "WHEN 0 THEN 0 WHEN 1 THEN 1 + RELEASE_LOCK(%(anchor)s) ELSE 1 END)"
            ),
            "SELECT 'asynclock-test-collect', SLEEP(5)",  # a collect slow enough to interrupt
        ),
        wake=heard.append,
        wake_all=lambda: heard.append("all"),
        anchor=anchor,
        op_timeout=10.0,
    )
    admin = await connect()
    try:
        await ear.start()
        channel = ear.channel
        assert channel is not None

        async def kill(marker: str) -> None:
            for _ in range(1000):
                cursor = await admin.cursor()
                await cursor.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST WHERE ID = %(id)s AND INFO "
                    "LIKE %(marker)s",
                    {"id": channel, "marker": f"%{marker}%"},
                )
                found = await cursor.fetchall()
                await cursor.close()
                if found:
                    cursor = await admin.cursor()
                    await cursor.execute(f"KILL QUERY {int(channel)}")
                    await cursor.close()
                    return
                await asyncio.sleep(0.005)
            raise AssertionError(f"the ear never ran {marker!r}")

        await kill("asynclock-semaphore-ear")  # the first release's kill
        await kill("asynclock-test-collect")  # the second's, on the collect
        for _ in range(1000):
            if heard:
                break
            await asyncio.sleep(0.002)
        assert heard == ["all"]
        assert ear.channel == channel  # kept its connection: no reconnect
    finally:
        admin.close()
        await ear.aclose()
        anchor.aclose()


async def handoff(two: Two) -> float:
    """Seconds from a release in the holder's state to the waiter's state taking the permit."""
    permit = Semaphore(two.holder, "k", limit=1, ttl=30.0)
    assert await permit.acquire(blocking=False)
    entered: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(wait(two.waiter, entered))
    await queued(two.holder, "k", 1)
    released = time.perf_counter()
    await permit.release()
    latency = await entered - released
    await waiting
    return latency


async def test_an_anchor_whose_connection_dies_is_opened_again(
    two: Two, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ears wait on a name the state's anchor holds (``_ear.py``): killed, it comes back.

    The ear that finds the name free gives it back and the anchor is opened again before it
    waits again; the next release reaches the waiter by push. Polling and the place's refresh
    are slowed to 30 s, so nothing else serves the waiter within the bound.
    """
    monkeypatch.setattr(_wake, "FIRST_POLL", SLOW_POLL)
    monkeypatch.setattr(_wake, "MAX_POLL", SLOW_POLL)
    monkeypatch.setattr(contend, "PLACE_REFRESH", SLOW_POLL)
    await handoff(two)  # the waiter's state has its ear and its anchor now
    name = two.waiter._ear_anchor.name
    admin = await two.holder._connect_dedicated()
    try:

        async def holder_of_name() -> int | None:
            cursor = await admin.cursor()
            await cursor.execute("SELECT IS_USED_LOCK(%(name)s)", {"name": name})
            (session,) = (await cursor.fetchall())[0]
            await cursor.close()
            return None if session is None else int(str(session))

        anchor = await holder_of_name()
        assert anchor is not None
        cursor = await admin.cursor()
        await cursor.execute(f"KILL CONNECTION {anchor}")
        await cursor.close()
        for _ in range(2000):
            again = await holder_of_name()
            if again not in (None, anchor):
                break
            await asyncio.sleep(0.005)
        else:
            raise AssertionError("the anchor was not opened again")
        latency = await handoff(two)
        assert latency < 1.0, f"served {latency:.3f} s after the release: not pushed"
    finally:
        admin.close()
