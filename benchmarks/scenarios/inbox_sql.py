"""Scenario ``inbox-sql``: the durable inbox on PostgresState and MySQLState (#12).

Per server (the loopback PostgreSQL and MariaDB of ``.ci/services.sh``, or
``ASYNCLOCK_POSTGRES_URL`` / ``ASYNCLOCK_MYSQL_URL``):

* **accept throughput**: serial ``EventDispatcher.accept`` calls over 20 keys, against the floor
  of the same server work: the ``inbox_accept`` statement of ``queries.sql`` sent by the driver
  itself on one connection, same arguments; interleaved round-robin;
* **statements per accept** and **per drained event** (one ``serve()`` draining what was
  accepted: steps, acquires, rescans), counted on the state;
* **accept -> handler start** p50/p99, one event at a time, the ``serve()`` on another state
  instance than the ``accept`` (as another process: on MySQL that is the polling path);
* **an idle worker's statements per second** (a ``serve()`` with nothing to do).

Rows go to the default tables under key prefixes of this run; the inboxes are drained at the end
(the claims and lock rows left expire, and the states' purge deletes them as usual).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import TYPE_CHECKING, Any

from benchmarks.harness.report import Section, kept, kv_table
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.sql_server import LABEL, MYSQL_URL, PG_URL, mysql_connect, pg_connect
from benchmarks.harness.stats import fmt

if TYPE_CHECKING:
    from benchmarks.harness.env import Asynclock, Config

KEYS = 20
URLS = {"postgres": PG_URL, "mysql": MYSQL_URL}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _count_statements(state: Any) -> dict[str, int]:
    """Count the statements ``state`` sends from now on (each goes through ``_call``)."""
    counter = {"n": 0}
    original = state._call

    async def call(statement: Any, params: Any, *, idempotent: bool) -> Any:
        counter["n"] += 1
        return await original(statement, params, idempotent=idempotent)

    state._call = call
    return counter


def _events(api: Asynclock, tag: str, n: int) -> list[Any]:
    event = api.module.Event
    return [event("message", "bench", "C", f"T{i % KEYS}", f"{tag}-{i}") for i in range(n)]


async def _accepts(api: Asynclock, url: str, prefix: str, n: int) -> tuple[float, float]:
    """(accepts per second, statements per accept) of ``n`` serial accepts."""
    state = api.module.state_from_url(url, prefix=prefix)
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
    await bot.accept(api.module.Event("message", "bench", "C", "warm", f"{prefix}warm"))
    events = _events(api, prefix, n)
    counter = _count_statements(state)
    t0 = time.perf_counter()
    for e in events:
        await bot.accept(e)
    elapsed = time.perf_counter() - t0
    await state.aclose()
    return n / elapsed, counter["n"] / n


async def _floor(backend: str, url: str, prefix: str, n: int) -> float:
    """Accepts per second of the raw ``inbox_accept`` statement sent by the driver."""
    from asynclock.state.sql._inbox import WAKE_GAP_MS
    from asynclock.state.sql._queries import key_id, load_queries

    query = load_queries(f"asynclock.state.{backend}", "asynclock_")["inbox_accept"]
    hexed = backend == "mysql"  # MySQL's statements UNHEX their ids

    def ident(text: str) -> object:
        digest = key_id(text)
        return digest.hex() if hexed else digest

    def params(i: int) -> dict[str, object]:
        claim = f"{prefix}claim-{i}"
        return {
            "id": ident(f"{prefix}T{i % KEYS}"),
            "name": f"{prefix}T{i % KEYS}",
            "space": ident(prefix),
            "payload": f'{{"n":{i}}}',
            "claim": ident(claim),
            "claim_name": claim,
            "claim_ttl_ms": 600_000,
            "max_pending": 10**6,
            "wake_gap_ms": WAKE_GAP_MS,  # the statement's parameters are the state's own
        }

    if backend == "postgres":
        sql, names = query.dollar()
        conn = await pg_connect(url, None)
        try:
            t0 = time.perf_counter()
            for i in range(n):
                values = params(i)
                await conn.fetch(sql, *[values[name] for name in names])
            return n / (time.perf_counter() - t0)
        finally:
            await conn.close()
    mysql = await mysql_connect(url)  # the session MySQLState sets up
    try:
        t0 = time.perf_counter()
        for i in range(n):
            cursor = await mysql.cursor()
            await cursor.execute(query.text, params(i))
            await cursor.fetchall()
            await cursor.close()
        return n / (time.perf_counter() - t0)
    finally:
        mysql.close()


async def _drain(api: Asynclock, url: str, prefix: str, n: int) -> tuple[float, float]:
    """(events per second, statements per event) for one serve() draining ``n`` events."""
    state = api.module.state_from_url(url, prefix=prefix)
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
    for e in _events(api, prefix, n):
        await bot.accept(e)
    done = asyncio.Event()
    handled = 0

    async def handler(e: Any) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            done.set()

    bot.add_handler("*", handler)
    counter = _count_statements(state)
    t0 = time.perf_counter()
    task = asyncio.create_task(bot.serve())
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - t0
    await bot.aclose()
    await task
    statements = counter["n"]
    await state.aclose()
    return n / elapsed, statements / n


async def _latency(api: Asynclock, url: str, prefix: str, n: int) -> list[float]:
    """Seconds from accept() (one state) until the handler starts (serve() on another)."""
    worker = api.module.state_from_url(url, prefix=prefix)
    producer = api.module.state_from_url(url, prefix=prefix)
    serving_bot = api.module.EventDispatcher(worker, on_lock_conflict="queue")
    accepting_bot = api.module.EventDispatcher(producer, on_lock_conflict="queue")
    started: dict[str, float] = {}
    arrived = asyncio.Event()

    async def handler(e: Any) -> None:
        started[e.message_id] = time.perf_counter()
        arrived.set()

    serving_bot.add_handler("*", handler)
    serving = asyncio.create_task(serving_bot.serve())
    await asyncio.sleep(0.3)
    samples = []
    for i in range(n):
        arrived.clear()
        t0 = time.perf_counter()
        await accepting_bot.accept(api.module.Event("message", "bench", "C", "probe", f"p{i}"))
        await asyncio.wait_for(arrived.wait(), 30)
        samples.append(started[f"p{i}"] - t0)
        await asyncio.sleep(0.02)  # the worker goes idle between probes
    await serving_bot.aclose()
    await serving
    await worker.aclose()
    await producer.aclose()
    return samples


async def _idle(api: Asynclock, url: str, prefix: str, seconds: float) -> float:
    """Statements per second of a serve() with nothing to do."""
    state = api.module.state_from_url(url, prefix=prefix)
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue")
    task = asyncio.create_task(bot.serve())
    await asyncio.sleep(0.5)  # past the first rescans and the back-off's short steps
    counter = _count_statements(state)
    await asyncio.sleep(seconds)
    statements = counter["n"]
    await bot.aclose()
    await task
    await state.aclose()
    return statements / seconds


async def _clean(api: Asynclock, url: str, prefix: str) -> None:
    """Drain what a benchmark left (the latency and idle runs leave nothing; accepts do)."""
    state = api.module.state_from_url(url, prefix=prefix)
    try:
        for info in await state.inbox_keys():
            if (await state.acquire(info.key, "bench-cleaner", 30.0)).token is None:
                continue
            done = None
            while (
                entry := await state.inbox_step(info.key, "bench-cleaner", done=done)
            ) is not None:
                done = entry.id
    finally:
        await state.aclose()


async def _one(api: Asynclock, cfg: Config, backend: str) -> list[tuple[str, str]]:
    url = URLS[backend]
    run = secrets.token_hex(4)
    n = 300 if cfg.quick else 1000
    rounds = cfg.rounds_or(5, 3)
    ours: list[float] = []
    floor: list[float] = []
    per_accept: list[float] = []
    prefixes = []
    for r in range(rounds):
        ours_prefix, floor_prefix = f"bench-inbox-{run}-a{r}:", f"bench-inbox-{run}-f{r}:"
        prefixes += [ours_prefix, floor_prefix]
        variants = [("ours", ours_prefix), ("floor", floor_prefix)]
        for which, prefix in variants if r % 2 == 0 else variants[::-1]:
            if which == "ours":
                rate, per = await _accepts(api, url, prefix, n)
                ours.append(rate)
                per_accept.append(per)
            else:
                floor.append(await _floor(backend, url, prefix, n))
    ratios = sorted(o / f for o, f in zip(ours, floor, strict=True))
    drain_rate, per_event = await _drain(api, url, f"bench-inbox-{run}-d:", n)
    latency = await _latency(api, url, f"bench-inbox-{run}-l:", 50 if cfg.quick else 200)
    idle = await _idle(api, url, f"bench-inbox-{run}-i:", 2.0 if cfg.quick else 5.0)
    for prefix in prefixes:
        await _clean(api, url, prefix)
    label = LABEL[backend]
    return [
        (f"{label}: accepts/s (median)", fmt(sorted(ours)[len(ours) // 2], 0)),
        (
            f"{label}: accepts/s, raw statement floor (median)",
            fmt(sorted(floor)[len(floor) // 2], 0),
        ),
        (
            f"{label}: accept / floor (median of per-round ratios; min-max)",
            f"{ratios[len(ratios) // 2]:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})",
        ),
        (f"{label}: statements per accept", f"{sorted(per_accept)[len(per_accept) // 2]:.2f}"),
        (f"{label}: drain, events/s, one serve(), {KEYS} keys", fmt(drain_rate, 0)),
        (f"{label}: statements per drained event", f"{per_event:.2f}"),
        (
            f"{label}: accept -> handler start, from another state: p50 / p99 ms",
            f"{_pct(latency, 0.5) * 1000:.2f} / {_pct(latency, 0.99) * 1000:.2f}",
        ),
        (f"{label}: idle serve(), statements/s", f"{idle:.1f}"),
    ]


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("inbox-sql", f"skipped: {api}\n")
    rows: list[tuple[str, str]] = []
    for backend in ("postgres", "mysql"):
        rows += await _one(api, cfg, backend)
    body = kept("inbox-sql-intro") + "\n\n" + kv_table(rows) + "\n"
    return Section("inbox-sql", body)


SCENARIO = Scenario("inbox-sql", run, redis=False)
