"""A bounded chaos soak (issue #7, "Nothing lost"): worker processes, faults at random times.

It runs once per lock backend (``[redis]``, ``[postgres]``, ``[mysql]``), with the same
platform, workers, effect store and history checks; only where the locks live and which faults
hit them differ.

Set-up:

* the **lock state**, where the workers' locks and dedupe records live and every fault lands:

  - ``[redis]``: a throwaway Redis server of this test (``redis_server``);
  - ``[postgres]`` / ``[mysql]``: the shared loopback PostgreSQL / MariaDB of the backend
    matrix, under a key prefix of this test alone (``asynclock-test:<hex>:``, deleted
    afterwards), with sessions tagged as this test's (``application_name`` on PostgreSQL, a
    user created for the test and dropped afterwards on MariaDB; see ``_sql.py``). Each worker
    reaches the server through a :class:`FaultProxy` of its own, run by the test;

* the **store server**, a second throwaway Redis (for every backend), never faulted, with the
  effect store the handlers write to (fenced by their tokens), the stamps of their critical
  sections, the workers' inboxes and their reports (see ``_soak_worker.py``);
* ``WORKERS`` spawned worker processes, each an ``EventDispatcher(on_lock_conflict="queue",
  lock_ttl=1 s, dedupe_ttl=600 s, raise_errors=False)`` over a state of the lock server
  (op/connect timeouts 0.5 s; on SQL at most 8 connections per worker);
* the **platform** (this test): ``threads_for(seconds)`` x ``MESSAGES`` events with unique
  dedupe keys, sent in bursts per thread, out of order, to random workers, some of them sent
  twice on purpose. Like a webhook platform it redelivers what was not acknowledged (a
  ``dropped``/``failed`` answer, a dispatch that raised, or a worker that died before
  answering) after a delay longer than the lock TTL, at most ``REDELIVERIES`` times; a send
  that is still not acknowledged then is *reported failed*. ``handled``, ``queued``,
  ``duplicate`` and ``skipped`` acknowledge.

Faults, from a seeded RNG (the seed is printed; ``ASYNCLOCK_SOAK_SEED`` replays a plan), at random
times during ``ASYNCLOCK_SOAK_SECONDS`` per backend (default 25: about 80 s for the three), every
kind of the backend in turn:

* every backend: ``kill-9``, SIGKILL of a random worker that has deliveries in flight (if one
  has within a second; a replacement is started at once);
* ``[redis]`` (:class:`RedisSide`):

  - ``client-kill``: ``CLIENT KILL TYPE normal`` and ``TYPE pubsub`` on the lock server (every
    connection of every worker, the wake-up listeners included);
  - ``pause<ttl`` / ``pause>ttl``: ``CLIENT PAUSE <ms> ALL``, shorter (200-600 ms) or longer
    (1.2-2 s) than the lock TTL;
  - ``restart``: the lock server is stopped and started on the same port (all its data is gone:
    locks and dedupe records; nothing is persisted; in the durable mode it reloads its
    append-only file, fsynced on every write);

* ``[postgres]`` / ``[mysql]`` (:class:`SQLSide`; the shared servers are never stopped and no
  other session is ever touched):

  - ``kill-sessions``: every session of the workers' states at once, by their tag
    (``pg_terminate_backend``, the LISTEN connections included; MariaDB ``KILL CONNECTION``);
  - ``stall<ttl`` / ``stall>ttl``: every worker's proxy blackholes (connections stay open and
    silent, new ones hang in their handshake) for 200-600 ms or 1.2-2 s: the server is out of
    everyone's reach, like a CLIENT PAUSE;
  - ``partition>ttl``: only one worker's proxy blackholes (a worker with deliveries in flight
    if one gets busy within a second), for 1.2-2 s, while the others go on: its locks expire
    under it and may be taken over.

Then the platform waits until every send has a final fate, stops the workers and checks the
history with :func:`tests.faults._soak_history.check`, the same checks for every backend:

* fencing: no two holders of a key both wrote while their critical sections overlapped; tokens
  grow; every write the store rejected was overtaken by a newer holder;
* exactly once in effect: an event is applied twice only after a ``kill -9`` of the worker that
  applied it first (the documented at-least-once case), when its dedupe record was lost in a
  restart of the lock server (Redis only), or when a dispatcher could not keep the event's
  claim (renew its lease or mark it done) while the lock state was out of reach, so the claim
  lapsed (the dispatcher's at-least-once, logged at WARNING and reported by the worker); each
  is counted apart. Anything else is a violation, a dispatch that answered ``failed`` after its
  handler had written included (the platform redelivers it);
* nothing vanished: every event was applied or reported failed; none was acknowledged (e.g.
  answered ``duplicate``) without ever being applied, and every send has a final fate.

Per-thread order is not checked: the platform delivers out of order.

**The durable mode** (``test_durable_soak_...``, once per server backend with an inbox:
``INBOX_BACKENDS`` of ``tests/_matrix.py``, so a backend that gains the inbox joins it there)
runs the same platform, plan and faults for ``ASYNCLOCK_DURABLE_SOAK_SECONDS`` (default 22),
but each worker answers a delivery as soon as ``EventDispatcher.accept`` returned (``accepted``
and ``duplicate`` acknowledge; ``failed`` when accept raised StateUnavailableError or
InboxFullError), before any handler ran, and a ``serve()`` of every worker drains the inbox with
the same fenced handler. ``kill-9`` then picks a worker that is inside a handler (the store
counts them per process), and ``restart`` restarts a lock server that keeps an append-only
file fsynced on every write: the durable inbox is as durable as its server, and that one
confirms nothing it could lose. The platform waits until every send has a final fate *and*
every acknowledged event was applied (or ``DRAIN_BOUND`` ran out), then checks: fencing as
above; **0 lost** (every acknowledged event applied at least once, a dead letter included);
**doubles only where ``ctx.attempt > 1``**; **0 out-of-order first handlings per key**: an
event acknowledged before another one was sent must be first handled before it (see
``_soak_history.py``).

The figures are printed per backend (``pytest -s``): faults per kind, connections/sessions killed, deliveries and
redeliveries, outcomes, events handled / failed / lost, double applications by cause,
overlapping sections, writes rejected by fencing. Each worker's dispatcher log and the list of
injected faults are kept in the test's ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from tests._matrix import (
    INBOX_BACKENDS,
    MYSQL,
    POSTGRES,
    REDIS,
    REDIS_CLUSTER,
    Backend,
    require,
)
from tests.faults import _soak_worker as W
from tests.faults._proxy import FaultProxy
from tests.faults._soak_history import (
    ACKNOWLEDGED,
    Delivery,
    History,
    Send,
    SendFate,
    Stamp,
    Verdict,
    check,
)
from tests.faults._sql import SQLTarget
from tests.faults._timing import report, until
from tests.faults.conftest import throwaway_redis

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
    from multiprocessing.context import SpawnProcess
    from pathlib import Path

    from tests.faults._server import RedisServer

#: seconds of faults per lock backend (CI: three backends, about 27 s each with set-up and drain)
SOAK_SECONDS = float(os.environ.get("ASYNCLOCK_SOAK_SECONDS") or 25.0)
#: seconds of faults of the durable mode per inbox backend (CI: Redis, about 32 s in all)
DURABLE_SOAK_SECONDS = float(os.environ.get("ASYNCLOCK_DURABLE_SOAK_SECONDS") or 22.0)
SEED = int(os.environ.get("ASYNCLOCK_SOAK_SEED") or random.SystemRandom().randrange(2**32))

pytestmark = [
    pytest.mark.faults,
    pytest.mark.processes,
    pytest.mark.slow,
    pytest.mark.timeout(int(max(SOAK_SECONDS, DURABLE_SOAK_SECONDS)) + 90),
]

WORKERS = 3
MESSAGES = 8
#: share of the events the platform sends twice on purpose
DUPLICATE_SHARE = 0.15
#: redeliveries of one send before it is reported failed
REDELIVERIES = 8
#: seconds before a redelivery: longer than the lock TTL (and the dispatcher's claim lease, which
#: is the lock TTL), as a platform retries after seconds
REDELIVER_AFTER = (1.5, 2.5)
#: seconds before the platform redelivers what a dead worker had in flight
AFTER_DEATH = (2.0, 3.0)
#: the originals are sent during this share of the soak; the faults go on to its end
FEED_SHARE = 0.75
#: seconds between two faults (from the end of one to the start of the next)
FAULT_GAP = (1.5, 3.0)
#: seconds of a CLIENT PAUSE (Redis) or a stall of the proxy (SQL): shorter or longer than the TTL
PAUSE_SHORT = (0.2, 0.6)
PAUSE_LONG = (1.2, 2.0)
REDIS_FAULTS = ("kill-9", "client-kill", "pause<ttl", "pause>ttl", "restart")
SQL_FAULTS = ("kill-9", "kill-sessions", "stall<ttl", "stall>ttl", "partition>ttl")
#: a spawned interpreter imports asynclock and redis first: slow on a loaded machine
SPAWN_BOUND = 30.0
#: after the soak, every send must have a final fate within this many seconds
DRAIN_BOUND = 40.0


def threads_for(seconds: float) -> int:
    """40 threads per 35 s of soak (29 for the CI run): a longer soak gets more, at the same rate."""
    return max(8, round(40 * seconds / 35.0))


def us(reply: Any) -> int:
    """A ``TIME`` reply in microseconds."""
    seconds, micros = reply
    return int(seconds) * 1_000_000 + int(micros)


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture
def store_server() -> Iterator[RedisServer]:
    """The store server: a second throwaway Redis that no fault ever touches."""
    yield from throwaway_redis()


class LockSide:
    """The lock server as the platform sees it: how workers reach it, and the faults it takes.

    Every fault but ``kill-9`` (the platform's own) is injected here.
    """

    name: str
    #: the kinds of fault of this backend, ``kill-9`` included
    kinds: tuple[str, ...]

    def __init__(self) -> None:
        self.connections_killed = 0
        #: restarts of the lock server: (store time before it was stopped, back) (Redis only)
        self.restarts: list[tuple[int, int]] = []

    async def spec(self, worker: str) -> W.LockSpec:
        """How the new worker ``worker`` reaches the lock state."""
        raise NotImplementedError

    async def inject(self, kind: str, platform: Platform) -> tuple[float, str]:
        """Inject one fault: how many seconds it lasts (the next one starts after), what it did."""
        raise NotImplementedError

    def figures(self) -> dict[str, float | str]:
        """What the summary adds for this backend."""
        return {"connections_killed": self.connections_killed}


class RedisSide(LockSide):
    """A throwaway Redis: CLIENT KILL, CLIENT PAUSE (< and > the lock TTL), restart."""

    name = "redis"
    kinds = REDIS_FAULTS

    def __init__(self, server: RedisServer, admin: Redis, prefix: str) -> None:
        super().__init__()
        self.server = server
        self.admin = admin
        self.prefix = prefix

    async def spec(self, worker: str) -> W.LockSpec:
        return W.LockSpec(self.server.url, self.prefix)

    async def on_lock_server(self, command: Callable[[], Awaitable[Any]]) -> Any:
        """An admin command; once more on a fresh connection if the server was restarted."""
        try:
            return await command()
        except RedisConnectionError:
            return await command()

    async def inject(self, kind: str, platform: Platform) -> tuple[float, str]:
        if kind == "client-kill":
            killed = 0
            for client_type in ("normal", "pubsub"):
                killed += int(
                    await self.on_lock_server(
                        partial(self.admin.client_kill_filter, _type=client_type, skipme=True)
                    )
                )
            self.connections_killed += killed
            return 0.0, f"{killed} connections killed"
        if kind in ("pause<ttl", "pause>ttl"):
            seconds = platform.rng.uniform(*(PAUSE_SHORT if kind == "pause<ttl" else PAUSE_LONG))
            await self.on_lock_server(
                partial(self.admin.client_pause, int(seconds * 1000), all=True)
            )
            return seconds, f"{seconds * 1000:.0f} ms"
        assert kind == "restart"
        stopped = await platform.now()
        await asyncio.to_thread(self.server.restart)
        back = await platform.now()
        self.restarts.append((stopped, back))
        return 0.0, f"down for {(back - stopped) / 1000:.0f} ms"


class SQLSide(LockSide):
    """The shared PostgreSQL or MariaDB, reached by each worker through a proxy of its own.

    The workers' sessions carry the test's tag (see ``_sql.py``), and each worker's connections
    go through a :class:`FaultProxy` of the test:

    * ``kill-sessions``: terminates (PostgreSQL, the LISTEN connections included) or KILLs
      (MariaDB) every session of the workers at once, and nobody else's;
    * ``stall<ttl`` / ``stall>ttl``: every proxy blackholes (connections stay open, silent;
      new ones hang in their handshake) for less or more than the lock TTL: the server is out
      of reach for everyone, like a CLIENT PAUSE of Redis;
    * ``partition>ttl``: only the proxy of one worker (one with deliveries in flight if one gets
      busy within a second) blackholes, for longer than the lock TTL, while the others go on:
      its locks expire under it and the others may take them over.

    The servers themselves are never stopped: other tests use them.
    """

    kinds = SQL_FAULTS

    def __init__(self, target: SQLTarget) -> None:
        super().__init__()
        self.target = target
        self.name = target.backend.name
        self.prefix = str(target.backend.options(target.namespace)["prefix"])
        self.proxies: dict[str, FaultProxy] = {}
        self.listeners_killed = 0
        #: every proxy blackholes (a proxy started meanwhile too)
        self.stalled = False

    async def spec(self, worker: str) -> W.LockSpec:
        proxy = self.proxies[worker] = await FaultProxy(self.target.port).__aenter__()
        proxy.blackhole = self.stalled
        return W.LockSpec(
            self.target.url(proxy.port),
            self.prefix,
            application_name=self.target.tag if self.target.postgres else None,
        )

    @property
    def dropped(self) -> int:
        return sum(proxy.dropped for proxy in self.proxies.values())

    async def inject(self, kind: str, platform: Platform) -> tuple[float, str]:
        if kind == "kill-sessions":
            listening = await self.target.listeners() if self.target.postgres else set()
            killed = await self.target.kill_all()
            self.connections_killed += len(killed)
            self.listeners_killed += len(listening & killed)
            listeners = f" ({len(listening & killed)} LISTENing)" if self.target.postgres else ""
            return 0.0, f"{len(killed)} sessions killed{listeners}"
        seconds = platform.rng.uniform(*(PAUSE_SHORT if kind == "stall<ttl" else PAUSE_LONG))
        dropped = self.dropped
        if kind == "partition>ttl":
            victim = await platform.busy_worker()
            proxies = [self.proxies[victim.name]]
            who = f"{victim.name} with {len(victim.in_flight)} deliveries in flight"
        else:
            assert kind in ("stall<ttl", "stall>ttl")
            proxies, who = list(self.proxies.values()), "every worker"
            self.stalled = True
        for proxy in proxies:
            proxy.blackhole = True
        try:
            await asyncio.sleep(seconds)  # the stall itself
        finally:
            self.stalled = False
            for proxy in self.proxies.values():
                proxy.blackhole = False
        return 0.0, f"{who} cut off for {seconds * 1000:.0f} ms, {self.dropped - dropped} B dropped"

    async def aclose(self) -> None:
        for proxy in self.proxies.values():
            await proxy.aclose()

    def figures(self) -> dict[str, float | str]:
        figures = super().figures()
        if self.target.postgres:
            figures["listeners_killed"] = self.listeners_killed
        figures["bytes_dropped"] = self.dropped
        return figures


@contextlib.asynccontextmanager
async def redis_side(server: RedisServer, prefix: str) -> AsyncIterator[LockSide]:
    """The lock side of a throwaway Redis ``server``."""
    # its own short timeouts: an admin call during an outage must not hang the test either
    admin = Redis(
        host="127.0.0.1", port=server.port, socket_timeout=5.0, socket_connect_timeout=2.0
    )
    try:
        yield RedisSide(server, admin, prefix)
    finally:
        await admin.aclose()


@contextlib.asynccontextmanager
async def sql_side(backend: Backend) -> AsyncIterator[LockSide]:
    """The lock side of the shared PostgreSQL / MariaDB of ``backend``, behind proxies."""
    require(backend)
    target = SQLTarget(backend)
    await target.start()
    side = SQLSide(target)
    try:
        yield side
    finally:
        try:
            await side.aclose()
        finally:
            # the test's keys are deleted; on MariaDB its sessions are killed and its user dropped
            await target.aclose()


@pytest.fixture(
    params=[
        pytest.param("redis", id="redis"),
        pytest.param(POSTGRES, id="postgres", marks=pytest.mark.postgres),
        pytest.param(MYSQL, id="mysql", marks=pytest.mark.mysql),
    ]
)
async def lock_side(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[LockSide]:
    """The lock server: a throwaway Redis, or the shared PostgreSQL / MariaDB behind a proxy."""
    backend: Backend | str = request.param
    if isinstance(backend, Backend):
        side = sql_side(backend)
    else:
        side = redis_side(request.getfixturevalue("redis_server"), prefix)
    async with side as opened:
        yield opened


#: the durable soak's backends: every server backend with the inbox (a backend joins by its line
#: in ``INBOX_BACKENDS`` of ``tests/_matrix.py``); each needs a way to fault it in ``durable_side``.
#: Redis Cluster is the one exception, as in the dispatch soak (``lock_side``): its faults need a
#: throwaway cluster of its own (the shared one must not be paused or restarted), so its failure
#: modes are covered by tests/conformance/test_cluster*.py instead (resharding with MOVED and
#: ASK, a killed connection, an unreachable cluster); see docs/decisions.md
DURABLE_BACKENDS = [
    pytest.param(b, id=b.name, marks=getattr(pytest.mark, b.marker or b.name))
    for b in INBOX_BACKENDS
    if b.server and b is not REDIS_CLUSTER
]


@pytest.fixture(params=DURABLE_BACKENDS)
async def durable_side(request: pytest.FixtureRequest, prefix: str) -> AsyncIterator[LockSide]:
    """The inbox server of the durable soak: for Redis a throwaway server that keeps an
    append-only file (a restart loses nothing it confirmed); PostgreSQL / MariaDB as above."""
    backend: Backend = request.param
    if backend is REDIS:
        with contextlib.contextmanager(throwaway_redis)(durable=True) as server:
            async with redis_side(server, prefix) as side:
                yield side
        return
    if backend not in (POSTGRES, MYSQL):
        pytest.fail(
            f"the durable soak has no way to fault {backend.name} yet: give it a LockSide "
            "in tests/faults/test_soak.py (the shared servers must not be paused or restarted)",
            pytrace=False,
        )
    async with sql_side(backend) as side:
        yield side


@dataclass
class Worker:
    name: str
    proc: SpawnProcess
    pid: int | None = None
    ready: bool = False
    #: ended: killed by the test, or found dead
    gone: bool = False
    in_flight: set[str] = field(default_factory=set)


@dataclass
class SendState:
    event: str
    thread: str
    deliveries: list[str] = field(default_factory=list)
    fate: SendFate = "unsettled"
    #: a (re)delivery is waiting in the platform's schedule
    scheduled: bool = False


@dataclass
class DeliveryState:
    send: int
    worker: str
    #: store time at which the platform pushed it to the worker
    sent: int
    outcome: str | None = None
    error: str | None = None
    received: int | None = None
    #: durable mode: store time at which the worker's accept() had returned
    answered: int | None = None
    #: in flight in a worker that was killed (it may still have reported before it died)
    killed_in_flight: bool = False
    #: the dispatcher could not keep the event's claim (``renew``, ``mark``)
    unkept: frozenset[str] = frozenset()


class Platform:
    """The webhook platform: sends, redelivers, starts and kills workers, injects faults."""

    def __init__(self, side: LockSide, store_url: str, logs: Path, *, durable: bool) -> None:
        self.logs = logs
        self.side = side
        #: the workers answer after accept() and handle in serve() (see the module docstring)
        self.durable = durable
        self.store_url = store_url
        self.store = Redis.from_url(store_url, socket_timeout=10.0)
        self.rng = random.Random(SEED)
        self.spawn = multiprocessing.get_context("spawn")
        self.workers: dict[str, Worker] = {}
        self.sends: list[SendState] = []
        self.deliveries: dict[str, DeliveryState] = {}
        self.schedule: list[tuple[float, int, int]] = []
        self.seq = 0
        self.names = itertools.count()
        self.faults: Counter[str] = Counter()
        self.redelivered: Counter[str] = Counter()
        self.kills: dict[int, int] = {}
        self.problems: list[str] = []
        self.started = time.monotonic()
        #: "<seconds since start> <kind> <detail>" per fault, written to faults.log
        self.fault_log: list[str] = []

    # -- workers ----------------------------------------------------------------------------

    async def start_worker(self) -> Worker:
        name = f"w{next(self.names)}"
        spec = await self.side.spec(name)
        proc = self.spawn.Process(
            target=W.serve,
            args=(
                name,
                spec,
                self.store_url,
                str(SEED),
                str(self.logs / f"{name}.log"),
                self.durable,
            ),
            daemon=True,
        )
        proc.start()
        worker = self.workers[name] = Worker(name, proc)
        return worker

    def ready(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.ready and not w.gone]

    async def worker_gone(self, worker: Worker) -> None:
        """The worker is dead: what it had in flight is redelivered later, by a survivor."""
        worker.gone = True
        await self.store.delete(W.inbox(worker.name))
        for delivery in worker.in_flight:
            state = self.deliveries[delivery]
            state.killed_in_flight = True
            send = self.sends[state.send]
            latest = delivery == send.deliveries[-1]
            if send.fate == "unsettled" and latest and not send.scheduled:
                self.redelivered["after a worker died"] += 1
                self.plan(state.send, self.rng.uniform(*AFTER_DEATH))
        worker.in_flight.clear()

    async def watch(self) -> None:
        """A worker that exits on its own is a problem (recorded); it is replaced all the same."""
        while True:
            for worker in list(self.workers.values()):
                if not worker.gone and worker.proc.exitcode is not None:
                    self.problems.append(f"worker {worker.name} exited ({worker.proc.exitcode})")
                    await self.worker_gone(worker)
                    await self.start_worker()
            await asyncio.sleep(0.25)

    # -- sends and reports ------------------------------------------------------------------

    def plan(self, send: int, delay: float) -> None:
        """(Re)deliver ``send`` in ``delay`` seconds."""
        self.sends[send].scheduled = True
        self.seq += 1
        heapq.heappush(self.schedule, (time.monotonic() + delay, self.seq, send))

    def plan_all(self, feed_seconds: float, threads: int) -> None:
        """Every event once, some twice; a thread's messages in two bursts, out of order."""
        for thread in range(threads):
            bursts = [self.rng.uniform(0.2, feed_seconds) for _ in range(2)]
            for message in range(MESSAGES):
                at = self.rng.choice(bursts) + self.rng.uniform(0.0, 0.15)
                event = f"t{thread:02d}-m{message}"
                copies = 2 if self.rng.random() < DUPLICATE_SHARE else 1
                for copy in range(copies):
                    self.sends.append(SendState(event, f"t{thread:02d}"))
                    later = self.rng.choice((0.0, self.rng.uniform(0.0, 3.0))) if copy else 0.0
                    self.plan(len(self.sends) - 1, at + later)

    async def pump(self) -> None:
        """Deliver every send that is due to a random ready worker."""
        n = 0
        while True:
            now = time.monotonic()
            ready = self.ready()
            while self.schedule and self.schedule[0][0] <= now and ready:
                _, _, index = heapq.heappop(self.schedule)
                send = self.sends[index]
                send.scheduled = False
                if send.fate != "unsettled":
                    continue
                worker = self.rng.choice(ready)
                n += 1
                delivery = f"d{n}"
                send.deliveries.append(delivery)
                self.deliveries[delivery] = DeliveryState(index, worker.name, await self.now())
                worker.in_flight.add(delivery)
                message = {"kind": "event", "delivery": delivery}
                message |= {"thread": send.thread, "event": send.event}
                await self.store.rpush(W.inbox(worker.name), json.dumps(message))
            await asyncio.sleep(0.01)  # pacing only

    async def collect(self) -> None:
        """Read the workers' reports: ``ready``, and each dispatch's outcome."""
        results = Redis.from_url(self.store_url, socket_timeout=10.0)
        try:
            while True:
                item = await results.blpop([W.RESULTS], timeout=1)
                if item is not None:
                    self.on_report(json.loads(item[1]))
        finally:
            await results.aclose()

    def on_report(self, report: dict[str, Any]) -> None:
        worker = self.workers[report["worker"]]
        if report["kind"] == "ready":
            worker.pid, worker.ready = report["pid"], True
            return
        if report["kind"] == "serve-ended":
            self.problems.append(f"worker {worker.name}: serve() ended early: {report['error']}")
            return
        delivery = report["delivery"]
        state = self.deliveries[delivery]
        worker.in_flight.discard(delivery)
        if state.outcome is not None:
            self.problems.append(f"delivery {delivery} reported twice")
        state.outcome, state.error = report["outcome"], report["error"]
        state.received, state.answered = report["received"], report["answered"]
        state.unkept = frozenset(report["unkept"])
        send = self.sends[state.send]
        if send.fate != "unsettled":
            return  # a late report (the send was acknowledged meanwhile)
        if state.outcome in ACKNOWLEDGED:
            send.fate = "acked"
        elif send.scheduled or delivery != send.deliveries[-1]:
            return  # a newer delivery of the send is on its way already
        elif len(send.deliveries) > REDELIVERIES:
            send.fate = "failed"
        else:
            self.redelivered[f"after {state.outcome}"] += 1
            self.plan(state.send, self.rng.uniform(*REDELIVER_AFTER))

    async def settled(self) -> bool:
        """Every send has a final fate; in the durable mode, every acknowledged event was
        applied too (the inbox is drained after the answers)."""
        if any(send.fate == "unsettled" for send in self.sends):
            return False
        if not self.durable:
            return True
        acked = {send.event for send in self.sends if send.fate == "acked"}
        return acked <= {text(k) for k in await self.store.hkeys(W.APPLIED)}

    # -- faults ------------------------------------------------------------------------------

    async def now(self) -> int:
        """The store server's clock, which every stamp of the history uses."""
        return us(await self.store.time())

    async def busy_worker(self) -> Worker:
        """A worker with deliveries in flight (durable mode: inside a handler, as the store
        counts them), if one gets busy within a second, else any."""
        deadline = time.monotonic() + 1.0
        while not (busy := await self.busy()):
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)  # polling the platform's own bookkeeping
        return self.rng.choice(busy or self.ready())

    async def busy(self) -> list[Worker]:
        if not self.durable:
            return [w for w in self.ready() if w.in_flight]
        handling = {
            int(pid) for pid, n in (await self.store.hgetall(W.HANDLING)).items() if int(n) > 0
        }
        return [w for w in self.ready() if w.pid in handling]

    async def inject(self, kind: str) -> tuple[float, str]:
        """Inject one fault: how many seconds it lasts (the next one starts after), what it did."""
        if kind != "kill-9":
            return await self.side.inject(kind, self)
        # a kill mid-event is the case that matters (its dedupe claims outlive it)
        victim = await self.busy_worker()
        assert victim.pid is not None
        in_flight = len(victim.in_flight)
        handling = int(await self.store.hget(W.HANDLING, str(victim.pid)) or 0)
        victim.gone = True  # from now on: watch() must not take its death for a crash
        os.kill(victim.pid, signal.SIGKILL)
        await asyncio.to_thread(victim.proc.join, 10.0)
        self.kills[victim.pid] = await self.now()
        await self.worker_gone(victim)
        replacement = await self.start_worker()
        return 0.0, (
            f"{victim.name} (pid {victim.pid}) killed with {in_flight} deliveries "
            f"in flight and {handling} handler calls running, {replacement.name} started"
        )

    async def chaos(self, seconds: float) -> None:
        """Faults at random times until ``seconds`` from now, every kind in turn (shuffled)."""
        end = time.monotonic() + seconds
        kinds: list[str] = []
        while True:
            await asyncio.sleep(self.rng.uniform(*FAULT_GAP))  # pacing of the plan
            if time.monotonic() >= end:
                return
            if not kinds:
                kinds = self.rng.sample(self.side.kinds, len(self.side.kinds))
            kind = kinds.pop()
            if kind == "kill-9" and len(self.ready()) < 2:
                kinds.insert(0, kind)  # keep a survivor: kill once a replacement is ready
                continue
            self.faults[kind] += 1
            at, clock = time.monotonic() - self.started, await self.now()
            lasts, what = await self.inject(kind)
            self.fault_log.append(f"{at:6.2f}s (store clock {clock}) {kind}: {what}")
            await asyncio.sleep(lasts)  # the pause runs its course before the next fault

    # -- the end -----------------------------------------------------------------------------

    async def stop_workers(self) -> None:
        for worker in self.workers.values():
            if not worker.gone:
                await self.store.rpush(W.inbox(worker.name), json.dumps({"kind": "stop"}))
        # one deadline for all of them: several stuck workers must not outlast the test timeout
        deadline = time.monotonic() + 20.0
        for worker in self.workers.values():
            await asyncio.to_thread(worker.proc.join, max(deadline - time.monotonic(), 0.1))
            if worker.proc.exitcode is None:
                self.problems.append(f"worker {worker.name} did not stop (its tasks: in its log)")
                with contextlib.suppress(ProcessLookupError):
                    assert worker.proc.pid is not None
                    os.kill(worker.proc.pid, signal.SIGUSR1)
        if any(w.proc.exitcode is None for w in self.workers.values()):
            await asyncio.sleep(0.5)  # lets the stuck workers write their task dump

    def kill_leftovers(self) -> None:
        for worker in self.workers.values():
            if worker.proc.is_alive():
                worker.proc.kill()
                worker.proc.join(5.0)

    async def history(self) -> History:
        stamps = tuple(
            Stamp(
                kind=r["kind"],
                key=r["key"],
                token=int(r["token"]),
                event=r["event"],
                delivery=r["delivery"],
                pid=int(r["pid"]),
                at=int(r["at"]),
                accepted=r["ok"] == 1,
                attempt=int(r["attempt"]),
            )
            for r in map(json.loads, await self.store.lrange(W.LOG, 0, -1))
        )
        counts = await self.store.hgetall(W.APPLIED)
        applied = {text(k): int(v) for k, v in counts.items()}
        deliveries = {
            name: Delivery(
                name,
                self.sends[d.send].event,
                d.outcome,
                d.error,
                killed=d.killed_in_flight and d.outcome is None,
                received=d.received,
                unkept=d.unkept,
                sent=d.sent,
                answered=d.answered,
            )
            for name, d in self.deliveries.items()
        }
        return History(
            events=frozenset(send.event for send in self.sends),
            sends=tuple(Send(s.event, tuple(s.deliveries), s.fate) for s in self.sends),
            deliveries=deliveries,
            stamps=stamps,
            applied=applied,
            kills=self.kills,
            restarts=tuple(self.side.restarts),
            durable=self.durable,
        )

    def summary(self, verdict: Verdict, soak: float, drain: float) -> None:
        name = f"durable {self.side.name}" if self.durable else self.side.name
        report(
            f"soak[{name}]",
            seed=SEED,
            soak=f"{soak:.1f}s",
            drain=f"{drain:.1f}s",
            total=f"{time.monotonic() - self.started:.1f}s",
            workers_started=len(self.workers),
            faults=",".join(f"{k}:{self.faults[k]}" for k in self.side.kinds),
            **self.side.figures(),
            events=verdict.events,
            sends=len(self.sends),
            deliveries=len(self.deliveries),
            redeliveries=",".join(f"{k}:{n}" for k, n in sorted(self.redelivered.items())),
        )
        report(
            f"soak history[{name}]",
            outcomes=",".join(f"{k}:{n}" for k, n in sorted(verdict.outcomes.items())),
            handled=verdict.handled,
            reported_failed=verdict.reported_failed,
            lost=verdict.lost,
            lost_after_kill=verdict.lost_after_kill,
            unsettled=verdict.unsettled,
            applied_twice_after_kill=verdict.applied_twice_after_kill,
            applied_twice_after_restart=verdict.applied_twice_after_restart,
            applied_twice_after_unkept_claim=verdict.applied_twice_after_unkept_claim,
            applied_twice_after_lock_lost=verdict.applied_twice_after_lock_lost,
            applied_twice_unexplained=verdict.applied_twice_unexplained,
            **(
                {
                    "applied_twice_redelivered": verdict.applied_twice_redelivered,
                    "ordered_pairs": verdict.ordered_pairs,
                    "out_of_order": verdict.out_of_order,
                }
                if self.durable
                else {}
            ),
            holders=verdict.holders,
            overlapping_sections=verdict.overlapping_sections,
            rejected_by_fencing=verdict.rejected_writes,
        )


async def test_chaos_soak_loses_nothing_and_fences_every_write(
    lock_side: LockSide, store_server: RedisServer, tmp_path: Path
) -> None:
    await soak(lock_side, store_server, tmp_path, SOAK_SECONDS, durable=False)


async def test_durable_soak_loses_nothing_and_keeps_accept_order(
    durable_side: LockSide, store_server: RedisServer, tmp_path: Path
) -> None:
    await soak(durable_side, store_server, tmp_path, DURABLE_SOAK_SECONDS, durable=True)


async def soak(
    side: LockSide, store_server: RedisServer, tmp_path: Path, seconds: float, *, durable: bool
) -> None:
    """Run the platform against ``side`` for ``seconds`` of faults, then check the history."""
    mode = "durable soak" if durable else "soak"
    print(
        f"\n[faults] {mode}[{side.name}]: seed={SEED} (ASYNCLOCK_SOAK_SEED replays the plan), "
        f"logs in {tmp_path}"
    )
    platform = Platform(side, store_server.url, tmp_path, durable=durable)
    background: list[asyncio.Task[None]] = []
    finished = False
    try:
        background.append(asyncio.create_task(platform.collect()))
        for _ in range(WORKERS):
            await platform.start_worker()

        async def all_ready() -> bool:
            return len(platform.ready()) == WORKERS

        await until(all_ready, "the workers to start", within=SPAWN_BOUND, interval=0.05)
        background += [
            asyncio.create_task(platform.pump()),
            asyncio.create_task(platform.watch()),
        ]
        platform.plan_all(FEED_SHARE * seconds, threads_for(seconds))
        started = time.monotonic()
        await platform.chaos(seconds)
        soaked = time.monotonic() - started

        drain_start = time.monotonic()
        # an unsettled send or an unhandled event is reported by the history check, with the rest
        with contextlib.suppress(AssertionError):
            await until(platform.settled, "the sends to settle", within=DRAIN_BOUND, interval=0.05)
        drain = time.monotonic() - drain_start
        finished = True
    finally:
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if finished:  # every send settled: the workers have nothing left to do
            await platform.stop_workers()
        platform.kill_leftovers()
    try:
        history = await platform.history()
    finally:
        await platform.store.aclose()
        (tmp_path / "faults.log").write_text("\n".join(platform.fault_log) + "\n")
    verdict = check(history)
    platform.summary(verdict, soaked, drain)
    problems = platform.problems + verdict.violations
    assert not problems, (
        f"{mode} on {side.name}, seed {SEED}: {len(problems)} violations (logs in {tmp_path}):\n"
        + "\n".join(problems[:30])
    )
    for kind in side.kinds:
        assert platform.faults[kind] > 0 or seconds < 20, f"no {kind} was injected"
    if durable:  # the order check must have had something to check
        assert verdict.ordered_pairs > 0, "no two events of a key had a known accept order"
