"""Scaling the inbox's workers (#24): what a wake-up costs with W workers, and kills among eight.

Workers are started as a user starts them (``python -m asynclock worker
tests._inbox_app:make_bot``, the harness of ``test_inbox_processes.py``), so these tests only use
the public API and hold for any hand-out design.

*A wake-up for one key costs one take, not W.* With W idle workers, one event is accepted for an
idle key, and the server work of every worker and of the producer is counted until it was
handled and the key is idle again (``tests/_server_work.py``: Redis requests from ``MONITOR``,
PostgreSQL statements and MySQL statements through a counting proxy per process; the test's own
checks are never counted). Periodic background work (rescans, a polling back-off, a blocking
wait's time-out) is taken out two ways: each event's count is that of its own window minus the
background rate measured over an idle second just before, times the window's length; and the
cost is the median over several events, so a rescan that happens to fall in one window does not
move it. The cost must not grow with W, and must be small.

*Eight workers, three SIGKILLed at random during 2,000 events*: nothing lost, first handlings in
accept order per key, a second handling only as a counted redelivery (``ctx.attempt > 1``),
never a write with a stale fencing token. Handlings are recorded by the handler itself in Redis
(``tests/_inbox_app.py``) before it returns, so a killed worker's handlings stay on the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import shutil
import signal
import statistics
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg  # type: ignore[import-untyped]
import pytest
from redis.crc import key_slot

from asynclock import Event, EventDispatcher, Outcome, state_from_url
from asynclock.state.sql._queries import key_id
from tests._matrix import (
    INBOX_SERVER_STATES,
    POSTGRES,
    POSTGRES_PGBOUNCER,
    REDIS,
    REDIS_CLUSTER,
    Backend,
    purge_namespace,
    require,
)
from tests._server_work import (
    CountingProxy,
    Record,
    RedisMonitor,
    Request,
    proxied_url,
    whose,
    with_client_name,
)
from tests._workers import REDIS_BACKENDS
from tests.conformance.test_inbox_processes import KEYS, Fleet, accept_all, check_history, event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from asynclock.state import State

pytestmark = [pytest.mark.processes, pytest.mark.redis, pytest.mark.timeout(300)]

#: the most server work one wake-up may cost, per backend (the accept and the worker's
#: re-issued blocking wait included): Redis requests, PostgreSQL and MySQL statements. On
#: PostgreSQL the fourth is the ear's sleep, re-issued after each wake-up: the waker cancels it,
#: so it commits nothing (3 committed transactions per event, the benchmark's count)
WAKE_UP_LIMIT = {
    "redis": 4,
    "redis-cluster": 4,
    "postgres": 4,
    "postgres-pgbouncer": 4,
    "mysql": 4,
}
#: events measured per worker count (the cost is their median)
WAKE_UPS = 7
#: seconds of the idle window that gives the background rate
IDLE_WINDOW = 1.0
#: bounds of the explicit waits
HANDLED_WITHIN = 15.0
WARM_EVENTS = 80


class CountedFleet(Fleet):
    """A :class:`Fleet` whose workers' (and producer's) server requests are counted, each
    under its own name: ``w0``, ``w1``, ... and ``p``."""

    def __init__(self, backend: Backend, namespace: str) -> None:
        super().__init__(backend, namespace)
        self.tag = f"sb{namespace[:10]}-"
        self.redis = backend.name in REDIS_BACKENDS
        self.record = Record()
        self.monitor = RedisMonitor(backend.url, self.tag) if self.redis else None
        self.proxies: list[CountingProxy] = []

    def env(self, **extra: str) -> dict[str, str]:
        return {**super().env(**extra), **extra}  # a worker's own (counted) URL wins

    async def url(self, who: str) -> str:
        """The state URL whose requests are counted as ``who``'s."""
        if self.redis:
            return with_client_name(self.backend.url, self.tag + who)
        return await proxied_url(self.backend.url, who, self.record, self.proxies)

    async def start_counted(self) -> None:
        """One more worker: lock TTL 30 s (its rescans every 5 s), handlers without a pause."""
        url = await self.url(f"w{len(self.workers)}")
        gate = f"{self.prefix}gate"
        self.start(
            INBOX_TEST_URL=url, INBOX_TEST_TTL="30", INBOX_TEST_PAUSE="0", INBOX_TEST_GATE=gate
        )

    async def seen(self, end: float) -> list[Request]:
        """Every counted request seen before ``end`` (``time.time()``)."""
        if self.monitor is not None:
            await self.monitor.sync()
            return [r for r in self.monitor.record.requests if r.at < end]
        return [r for r in self.record.requests if r.at < end]

    async def handlings(self, thread: str) -> list[tuple[str, int, int, int]]:
        """(message id, attempt, token, pid) of every handling of ``thread``'s events."""
        raw = await self.effects.lrange(f"{self.prefix}fx:slack:C1:{thread}", 0, -1)
        out = []
        for item in raw:
            message, attempt, token, pid = (
                item.decode() if isinstance(item, bytes) else item
            ).split()
            out.append((message, int(attempt), int(token), int(pid)))
        return out


@pytest.fixture(params=INBOX_SERVER_STATES)
async def fleet(request: pytest.FixtureRequest) -> AsyncIterator[CountedFleet]:
    backend: Backend = request.param
    require(REDIS)  # the effect store
    require(backend)
    made = CountedFleet(backend, uuid.uuid4().hex)
    try:
        yield made
    finally:
        for worker in made.workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        for proxy in made.proxies:
            await proxy.aclose()
        await made.effects.aclose()
        await purge_namespace(REDIS, made.namespace)
        if backend is not REDIS:
            await purge_namespace(backend, made.namespace)
        shutil.rmtree(made.folder, ignore_errors=True)


def idle_threads(backend: Backend) -> Iterator[str]:
    """Fresh thread ids, each of a key nobody used. On Redis Cluster all in one hash slot, so
    that after the first accept the slot is listed (``docs/inbox.md``, on Redis Cluster): a
    first accept into an unlisted slot whose directory hash is on another master costs two more
    round trips, whatever the worker count."""
    run = uuid.uuid4().hex[:6]
    names = (f"I{run}-{n}" for n in range(10**9))
    if backend is not REDIS_CLUSTER:
        yield from names
        return
    slot = None
    for name in names:
        here = key_slot(f"slack:C1:{name}".encode())
        if slot is None:
            slot = here
        if here == slot:
            yield name


@dataclass
class Window:
    """One wake-up: from just before its accept to just before the next one."""

    start: float
    end: float
    requests: list[Request]

    def cost(self, idle_rate: float) -> float:
        return len(self.requests) - idle_rate * (self.end - self.start)


@dataclass
class WakeUpCost:
    """The wake-ups measured with ``workers`` workers, and the background rate beside them."""

    workers: int
    idle_rate: float
    windows: list[Window]

    @property
    def per_event(self) -> float:
        return statistics.median(w.cost(self.idle_rate) for w in self.windows)

    def describe(self) -> str:
        counts = [len(w.requests) for w in self.windows]
        spans = [round((w.end - w.start) * 1000) for w in self.windows]
        everyone = whose(r for w in self.windows for r in w.requests)
        kinds = whose((r for w in self.windows for r in w.requests), by_kind=True)
        return (
            f"W={self.workers}: {self.per_event:.2f} per wake-up (median; counts {counts} in "
            f"windows of {spans} ms, idle background {self.idle_rate:.1f}/s); over the "
            f"{len(self.windows)} wake-ups by client {everyone}, by kind {kinds}"
        )


async def wait_until(
    what: str, check: Callable[[], Awaitable[bool]], within: float = HANDLED_WITHIN
) -> None:
    """Poll ``check()`` (an async predicate) until true; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.001)


async def wake_up(
    fleet: CountedFleet, producer: EventDispatcher, checker: State, thread: str
) -> float:
    """Accept one event for the idle ``thread``; return once it was handled and its key is idle
    again. Returns when the accept was called (``time.time()``)."""
    start = time.time()
    outcome = await producer.accept(Event("message", "slack", "C1", thread, f"{thread}-m"))
    assert outcome == Outcome.ACCEPTED
    await settled(fleet, checker, thread)
    return start


async def warm_up(
    fleet: CountedFleet, producer: EventDispatcher, checker: State, threads: Iterator[str]
) -> None:
    """Keep the workers busy until every one of them has taken an event: each is listening then.

    The handlers wait at a closed gate (``INBOX_TEST_GATE``), so a worker that took an event
    stays busy with it, and the next event has to reach another one (whatever the hand-out's
    choice of worker, it must not be a busy one). Then the gate opens and every event is
    handled, and their keys go idle again.
    """
    pids = {w.pid for w in fleet.workers}
    gate = f"{fleet.prefix}gate"
    await fleet.effects.set(gate, "closed")
    taken: list[str] = []

    async def inside() -> dict[int, int]:
        running = await fleet.effects.hgetall(f"{fleet.prefix}inside")
        return {int(pid): int(count) for pid, count in running.items() if int(count) > 0}

    try:
        while not set(await inside()) >= pids:
            assert len(taken) < WARM_EVENTS, (
                f"after {WARM_EVENTS} events, workers {sorted(pids - set(await inside()))} "
                f"had taken none while the others were busy\n{fleet.output()}"
            )
            thread = next(threads)
            outcome = await producer.accept(Event("message", "slack", "C1", thread, f"{thread}-m"))
            assert outcome == Outcome.ACCEPTED
            taken.append(thread)

            async def all_taken() -> bool:
                return sum((await inside()).values()) == len(taken)

            await wait_until(f"{len(taken)} warm-up events taken\n{fleet.output()}", all_taken)
    finally:
        await fleet.effects.set(gate, "open")
    for thread in taken:
        await settled(fleet, checker, thread)


async def settled(fleet: CountedFleet, checker: State, thread: str) -> int:
    """Wait until ``thread``'s event was handled and its key is idle again (no holder, nothing
    pending); the pid of the worker that handled it."""

    async def handled() -> bool:
        return bool(await fleet.handlings(thread))

    async def idle() -> bool:
        key = f"slack:C1:{thread}"
        return await checker.inspect(key) is None and key not in await checker.inbox_ready()  # type: ignore[attr-defined]

    await wait_until(f"{thread} handled\n{fleet.output()}", handled)
    await wait_until(f"{thread}'s key idle again", idle)
    return (await fleet.handlings(thread))[0][3]


async def measure(
    fleet: CountedFleet, producer: EventDispatcher, checker: State, threads: Iterator[str]
) -> WakeUpCost:
    idle_start = time.time()
    await asyncio.sleep(IDLE_WINDOW)  # the window in which the background rate is counted
    idle_end = time.time()
    starts = [await wake_up(fleet, producer, checker, next(threads)) for _ in range(WAKE_UPS)]
    end = time.time()
    seen = await fleet.seen(end)
    idle = [r for r in seen if idle_start <= r.at < idle_end]
    bounds = [*starts, end]
    windows = [
        Window(a, b, [r for r in seen if a <= r.at < b]) for a, b in itertools.pairwise(bounds)
    ]
    return WakeUpCost(len(fleet.workers), len(idle) / (idle_end - idle_start), windows)


async def pg_registered(fleet: CountedFleet, workers: int) -> None:
    """On PostgreSQL, wait until ``workers`` workers have registered (their rows, their ears):
    under load a worker that starts late would miss the whole warm-up, its events all taken by
    the others."""
    if fleet.backend not in (POSTGRES, POSTGRES_PGBOUNCER):
        return
    conn = await asyncpg.connect(POSTGRES.url)
    try:

        async def all_there() -> bool:
            rows = await conn.fetchval(
                "SELECT count(*) FROM asynclock_inbox_workers"
                " WHERE space = $1 AND expires_at > now() AND ear IS NOT NULL",
                key_id(fleet.prefix),
            )
            return int(rows) == workers

        await wait_until(f"{workers} workers registered\n{fleet.output()}", all_there, 60.0)
    finally:
        await conn.close()


async def test_a_wake_up_for_one_key_costs_one_take_not_one_per_worker(
    fleet: CountedFleet,
) -> None:
    counted = fleet
    backend = counted.backend
    state = state_from_url(await counted.url("p"), prefix=counted.prefix)
    checker = state_from_url(backend.url, prefix=counted.prefix)  # not counted
    producer = EventDispatcher(state, on_lock_conflict="queue")
    threads = idle_threads(backend)
    costs: dict[int, WakeUpCost] = {}
    try:
        async with counted.monitor or contextlib.nullcontext():
            for workers in (1, 6):
                while len(counted.workers) < workers:
                    await counted.start_counted()
                # every worker has loaded its app (and joins the hand-out right after): else
                # the first one, draining up to max_keys keys at once, takes every warm-up event
                await counted.ready()
                await pg_registered(counted, workers)
                await warm_up(counted, producer, checker, threads)
                costs[workers] = await measure(counted, producer, checker, threads)
    finally:
        await state.aclose()
        await checker.aclose()
    report = "\n".join(c.describe() for c in costs.values())
    print(f"[{backend.name}] server work per wake-up:\n{report}")
    one, six = round(costs[1].per_event), round(costs[6].per_event)
    limit = WAKE_UP_LIMIT[backend.name]
    assert six <= one + 1, f"a wake-up's cost grows with the workers:\n{report}"
    assert max(one, six) <= limit, f"a wake-up costs more than {limit}:\n{report}"
    # in a thread: the SQL workers' last statements (their rows deleted, UNLISTEN) go through
    # the counting proxies, which this event loop runs
    assert sorted(await asyncio.to_thread(counted.stop)) == [0] * 6


#: test (b): events, workers, how many are killed, and the bound of the whole run
KILL_EVENTS = 2000
KILL_WORKERS = 8
KILLS = 3
KILL_RUN_WITHIN = 150.0


async def handlings_so_far(fleet: Fleet) -> int:
    """How many handlings the workers recorded (one LLEN per key, one round trip)."""
    async with fleet.effects.pipeline(transaction=False) as pipe:
        for k in range(KEYS):
            pipe.llen(f"{fleet.prefix}fx:slack:C1:T{k}")
        return sum(await pipe.execute())


# a second way to the PostgreSQL that the direct row covers: left out, as for every slow test
# (tests/_matrix.py), since PgBouncer's four server connections, shared with the whole suite,
# make 2,000 events take minutes
@pytest.mark.slow
async def test_b_eight_workers_three_killed_at_random_lose_nothing_and_keep_order(
    fleet: CountedFleet,
) -> None:
    # plain workers (lock TTL 1 s, handlers of 5-30 ms); nothing is counted here
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    for _ in range(KILL_WORKERS):
        fleet.start()
    events = [event(n % KEYS, n // KEYS) for n in range(KILL_EVENTS)]
    # the kills land at random points of the run, each in a worker that is inside a handler
    marks = sorted(rng.uniform(0.05, 0.75) * KILL_EVENTS for _ in range(KILLS))
    started = time.monotonic()
    accepting = asyncio.create_task(accept_all(fleet, events))
    killed: list[int] = []
    deadline = started + KILL_RUN_WITHIN
    while len(killed) < KILLS:
        done = await handlings_so_far(fleet)
        if done >= marks[len(killed)]:
            running = await fleet.effects.hgetall(f"{fleet.prefix}inside")
            inside = {int(pid) for pid, count in running.items() if int(count) > 0}
            # not one killed already: a SIGKILLed process may not have exited (poll() None) yet
            victims = [
                w
                for w in fleet.workers
                if w.pid in inside and w.pid not in killed and w.poll() is None
            ]
            if victims:
                victim = rng.choice(victims)
                os.kill(victim.pid, signal.SIGKILL)
                killed.append(victim.pid)
                print(f"killed worker {victim.pid} after {done} handlings (seed {seed})")
        assert time.monotonic() < deadline, (
            f"only {len(killed)} kills after {KILL_RUN_WITHIN} s ({done} handlings, seed {seed})"
            f"\n{fleet.output()}"
        )
        await asyncio.sleep(0.005)
    await asyncio.wait_for(accepting, KILL_RUN_WITHIN)
    found = await fleet.wait_all(KILL_EVENTS, within=max(deadline - time.monotonic(), 1.0))
    elapsed = time.monotonic() - started
    doubles = check_history(found, events)
    assert int(await fleet.effects.get(f"{fleet.prefix}stale") or 0) == 0
    await fleet.ready()
    codes = fleet.stop()
    assert sorted(codes) == [-signal.SIGKILL] * KILLS + [0] * (KILL_WORKERS - KILLS), codes
    # a killed worker leaves at most the entry in hand of each key it drained
    assert doubles <= KILLS * KEYS
    state = state_from_url(fleet.backend.url, prefix=fleet.prefix)
    try:
        assert await state.inbox_ready() == []  # type: ignore[attr-defined]
    finally:
        await state.aclose()
    print(
        f"[{fleet.backend.name}] {KILL_EVENTS} events, {KILL_WORKERS} workers, {KILLS} killed "
        f"(seed {seed}): all handled in {elapsed:.1f} s, {doubles} redelivered"
    )


#: the stream of test (c): events to idle keys, accepted back to back
STREAM_EVENTS = 24


@pytest.fixture(
    params=[
        pytest.param(b, id=b.name, marks=pytest.mark.postgres)
        for b in (POSTGRES, POSTGRES_PGBOUNCER)
    ]
)
async def pg_fleet(request: pytest.FixtureRequest) -> AsyncIterator[CountedFleet]:
    """A :class:`CountedFleet` on PostgreSQL (direct and behind PgBouncer), nothing counted."""
    backend: Backend = request.param
    require(REDIS)  # the effect store
    require(backend)
    made = CountedFleet(backend, uuid.uuid4().hex)
    try:
        yield made
    finally:
        for worker in made.workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        await made.effects.aclose()
        await purge_namespace(REDIS, made.namespace)
        await purge_namespace(backend, made.namespace)
        shutil.rmtree(made.folder, ignore_errors=True)


async def test_c_a_stream_of_events_sends_no_notify_whatever_the_workers(
    pg_fleet: CountedFleet,
) -> None:
    # At each commit that NOTIFYs, PostgreSQL (up to 18 at least) signals every LISTENing session
    # of the database, whatever its channel, and each one reads the queue in a transaction of its
    # own: with W workers, every NOTIFY costs W transactions. So a stream of events to idle keys
    # NOTIFYs nobody, with 1 worker or 6: each wake-up reaches one worker through its ear (a
    # cancelled sleep, the key in its row: asynclock/state/postgres/_ear.py), and the drain's
    # release NOTIFYs nobody (no waiter flagged the key), which it did at every event before
    # (#24: 2 more transactions per event per worker). Counted exactly: the test LISTENs on every
    # worker's channel (the ear's fallback) and on the release channel.
    fleet = pg_fleet
    space = key_id(fleet.prefix)
    released = "asynclock_released"  # the default table prefix's release channel
    threads = idle_threads(fleet.backend)
    producer_state = state_from_url(fleet.backend.url, prefix=fleet.prefix)
    producer = EventDispatcher(producer_state, on_lock_conflict="queue")
    listener = await asyncpg.connect(POSTGRES.url)
    heard: dict[str, list[str]] = {released: []}
    synced = asyncio.Event()
    sentinel = f"asynclock_test_{uuid.uuid4().hex[:12]}"

    def on_notify(conn: object, pid: object, channel: object, payload: object) -> None:
        heard.setdefault(str(channel), []).append(str(payload))

    async def sync() -> None:
        # notifications arrive in commit order: the sentinel, sent last, comes after all of them
        synced.clear()
        await listener.execute("SELECT pg_notify($1, '')", sentinel)
        await asyncio.wait_for(synced.wait(), HANDLED_WITHIN)

    per_event: dict[int, float] = {}
    try:
        await listener.add_listener(sentinel, lambda *_: synced.set())
        await listener.add_listener(released, on_notify)
        for workers in (1, 6):
            while len(fleet.workers) < workers:
                fleet.start(INBOX_TEST_TTL="30", INBOX_TEST_PAUSE="0")

            async def registered(workers: int = workers) -> bool:
                rows = await listener.fetch(
                    "SELECT channel FROM asynclock_inbox_workers"
                    " WHERE space = $1 AND expires_at > now()",
                    space,
                )
                return len(rows) == workers

            await wait_until(f"{workers} workers registered\n{fleet.output()}", registered)
            for row in await listener.fetch(
                "SELECT channel FROM asynclock_inbox_workers WHERE space = $1", space
            ):
                if row[0] not in heard:
                    heard[row[0]] = []
                    await listener.add_listener(row[0], on_notify)
            await sync()
            for payloads in heard.values():
                payloads.clear()
            batch = [next(threads) for _ in range(STREAM_EVENTS)]
            mine = {key_id(f"{fleet.prefix}slack:C1:{t}").hex() for t in batch}
            for thread in batch:
                outcome = await producer.accept(
                    Event("message", "slack", "C1", thread, f"{thread}-m")
                )
                assert outcome == Outcome.ACCEPTED
            for thread in batch:
                await settled(fleet, producer_state, thread)
            await sync()
            releases = [p for p in heard[released] if p in mine]
            assert releases == [], f"W={workers}: the drain's releases NOTIFYed {len(releases)}x"
            wake_ups = sum(
                1 for c, payloads in heard.items() if c != released for p in payloads if p in mine
            )
            per_event[workers] = wake_ups / STREAM_EVENTS
            assert wake_ups == 0, (
                f"W={workers}: {wake_ups} wake-up NOTIFYs for {STREAM_EVENTS} events"
            )
        print(f"[{fleet.backend.name}] wake-up NOTIFYs per event: {per_event}")
    finally:
        await listener.close()
        await producer_state.aclose()
    assert sorted(await asyncio.to_thread(fleet.stop)) == [0] * 6
