"""Scenario ``inbox-scale`` (#24): the durable inbox with 1, 2, 4, 8 and 16 worker processes.

Per series (asynclock on Redis, Redis Cluster, PostgreSQL, MariaDB; procrastinate with ``lock=``
on PostgreSQL; a Redis Streams consumer group as the floor: their processes are
``_inbox_scale_sides.py``, the counting of their server work ``_inbox_scale_count.py``) and per
worker count W, two workloads, each in a *cell* of its own (fresh worker processes, a fresh
namespace):

* **trickle**: W workers run and have handled a warm-up of 20 events; one producer sends
  1,000 events over 200 keys (5 each, a key's next only once its previous was accepted) at
  700/s (Redis) or 300/s (SQL), each call in a task of its own on the schedule;
* **backlog**: 1,000 keys holding one entry each are accepted first; then W workers start
  and drain them.

Per cell: server work per event, events/s, accept -> handled p50/p99 (backlog: from the
workers' start), whether the first handlings of every key kept its accept order and whether
anything was lost. Server work: Redis requests counted by ``MONITOR`` over the measured window
(the accepts included); MariaDB statements counted at the driver over the window; PostgreSQL
committed transactions of the scenario's own database from before the cell's first connection
until its last one closed, minus the same cell run without the measured events (start-up,
warm-up and shutdown cancel out). Beside them, on PostgreSQL: accepts/s from 8 producer
processes while 4 workers drain, and one worker draining 1,000 events over 20 keys.

``--write`` stores the run in ``benchmarks/summary/inbox-scale.json`` under the commit of the
last change to ``asynclock/`` (so before and after a change stay side by side) and redraws the
doc block from every stored run (``--plots`` also ``docs/img/inbox-scale.png``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness.env import REPO, git, log, now_utc
from benchmarks.harness.report import Section, kept, kv_table
from benchmarks.harness.results import dump
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.servers import configured_url
from benchmarks.harness.spawn import Children
from benchmarks.harness.sql_server import MYSQL_URL, PG_URL
from benchmarks.harness.stats import fmt, percentile
from benchmarks.scenarios import _inbox_scale_count as count
from benchmarks.scenarios import _inbox_scale_sides as sides

if TYPE_CHECKING:
    from benchmarks.harness.env import Asynclock, Config

SERIES = ("redis", "redis-cluster", "postgres", "mysql", sides.PROCRASTINATE, sides.STREAMS)
LABEL = {
    "redis": "asynclock on Redis",
    "redis-cluster": "asynclock on Redis Cluster (3 masters)",
    "postgres": "asynclock on PostgreSQL",
    "mysql": "asynclock on MariaDB",
    sides.PROCRASTINATE: "procrastinate, `lock=` per key (PostgreSQL)",
    sides.STREAMS: "Redis Streams consumer group (the floor; no per-key order)",
}
UNIT = {
    "redis": "requests",
    "redis-cluster": "requests",
    sides.STREAMS: "requests",
    "postgres": "transactions",
    sides.PROCRASTINATE: "transactions",
    "mysql": "statements",
}
RATE = {"redis": 700, "redis-cluster": 700, sides.STREAMS: 700}  # the others: 300 events/s
SQL_RATE = 300
WORKERS, QUICK_WORKERS = (1, 2, 4, 8, 16), (1, 4)
EVENTS, KEYS, QUICK_EVENTS, QUICK_KEYS = 1000, 200, 100, 20
WARM = 20
#: seconds after the last handling before a window closes (the last steps and blocking waits)
SETTLE = 0.3
PRODUCERS, LISTENING = 8, 4
#: every stored run, one per commit of asynclock/ (committed: the doc block shows them side by side)
RESULTS = REPO / "benchmarks" / "summary" / "inbox-scale.json"
#: a comma-separated list of series to run (default: all); with ``--write`` they replace their
#: cells in the stored run of the same commit
SERIES_ENV = "ASYNCLOCK_BENCH_SCALE_SERIES"


@dataclass
class Cell:
    """One series, worker count and workload: what it cost and what became of the events."""

    series: str
    workers: int
    mode: str
    events: int
    keys: int
    cost: float = float("nan")  # server work per event (the series' unit)
    events_s: float = float("nan")
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    lost: int = 0
    order_held: bool = True
    redelivered: int = 0
    seconds: float = 0.0
    error: str = ""


@dataclass
class Target:
    """Where a series runs and how its server work is counted."""

    series: str
    url: str
    monitor: count.MonitorFiles | None = None
    admin_url: str = ""  # PostgreSQL: where pg_stat_database is read

    @property
    def unit(self) -> str:
        return UNIT[self.series]


async def run_cell(
    target: Target, cfg: Config, workers: int, mode: str, events: int, keys: int
) -> tuple[Cell, int]:
    """One cell; returns it (without its cost) and the raw server work counted."""
    namespace = cfg.key("scale", target.series, mode, str(workers), str(events), str(keys))
    side = sides.Side(target.series, target.url, namespace)
    cell = Cell(target.series, workers, mode, events, keys)
    ids = [(f"k{i % keys}", f"k{i % keys}-{i // keys}") for i in range(events)]
    accepted: dict[str, float] = {}
    window = sides.Window()
    children = Children()
    go, stop = children.ctx.Event(), children.ctx.Event()
    collector = sides.Collector(children)
    before = await count.committed(target.admin_url) if target.admin_url else 0
    if target.series == sides.STREAMS:
        await _create_group(side)
    producer = await sides.Producer(side).open()
    rate = None if mode == "backlog" else RATE.get(target.series, SQL_RATE)
    t_go = 0.0
    started = time.perf_counter()
    try:
        if mode == "backlog":
            window.mark()
            await sides.send_all(producer, ids, accepted, None)
        children.start(sides.worker_main, [(side, i, go, stop) for i in range(workers)])
        await collector.until(lambda: collector.ready == workers, 180, "workers ready")
        go.set()
        t_go = time.perf_counter()
        if mode == "trickle":
            warm = [(f"warm-{i}", f"warm-{i}") for i in range(WARM)]
            await sides.send_all(producer, warm, {}, None)
            await collector.until(
                lambda: all(m in collector.handled for _, m in warm), 60, "warm-up handled"
            )
            await asyncio.sleep(SETTLE)  # the warm-up's last steps are done
            window.mark()
            await sides.send_all(producer, ids, accepted, rate)
        await collector.until(
            lambda: all(m in collector.handled for _, m in ids),
            60 + 2 * events / rate if rate else 300,
            f"{events} events handled",
        )
        await asyncio.sleep(SETTLE)  # the last steps and blocking waits are sent
        window.mark()
        stop.set()
        await collector.until(lambda: len(collector.stamps) == workers, 60, "workers stopped")
    except (RuntimeError, TimeoutError) as exc:
        cell.error = str(exc).splitlines()[0]
        log(f"inbox-scale: {target.series} W={workers} {mode}: {exc}")
        if len(window.mono) == 1:
            window.mark()
    finally:
        stop.set()
        await asyncio.to_thread(children.join)
        collector.close()
        await producer.aclose()
    cell.seconds = time.perf_counter() - started
    _outcomes(cell, ids, accepted, collector.handled, t_go)
    work = await _work(target, side, window, collector, before)
    await _clean(target, side)
    return cell, work


def _outcomes(
    cell: Cell,
    ids: list[tuple[str, str]],
    accepted: dict[str, float],
    handled: dict[str, list[tuple[float, int, str]]],
    t_go: float,
) -> None:
    """Latency, events/s, order per key, losses and redeliveries of a cell's events."""
    if not ids:
        return
    first = {m: min(h)[0] for m, h in handled.items()}
    measured = [m for _, m in ids if m in first]
    cell.lost = len(ids) - len(measured)
    cell.redelivered = sum(1 for m in measured for _, attempt, _ in handled[m] if attempt > 1)
    by_key: dict[str, list[str]] = {}
    for key, message in ids:
        by_key.setdefault(key, []).append(message)
    cell.order_held = all(
        sorted((m for m in messages if m in first), key=first.__getitem__)
        == [m for m in messages if m in first]
        for messages in by_key.values()
    )
    if not measured:
        return
    since = {m: accepted[m] if cell.mode == "trickle" else t_go for m in measured}
    delays = [(first[m] - since[m]) * 1000 for m in measured]
    cell.p50_ms, cell.p99_ms = percentile(delays, 50), percentile(delays, 99)
    begin = min(accepted.values()) if cell.mode == "trickle" else t_go
    cell.events_s = len(measured) / max(max(first[m] for m in measured) - begin, 1e-9)


async def _work(
    target: Target,
    side: sides.Side,
    window: sides.Window,
    collector: sides.Collector,
    before: int,
) -> int:
    """The server work of the cell (see the module: per series, one way)."""
    if target.admin_url:
        return await count.committed(target.admin_url) - before
    if len(window.mono) < 2:
        return 0
    if target.monitor is not None:
        await target.monitor.sync()
        return target.monitor.count(side.namespace, window.wall[0], window.wall[1])
    start, end = window.mono[0], window.mono[1]  # MariaDB: statements seen by the drivers
    stamps = [*count.STAMPS, *(s for child in collector.stamps for s in child)]
    return sum(1 for s in stamps if start <= s < end)


async def _create_group(side: sides.Side) -> None:
    client = redis.asyncio.Redis.from_url(side.url)
    try:
        await client.xgroup_create(side.stream, "workers", id="0", mkstream=True)
    finally:
        await client.aclose()


async def _clean(target: Target, side: sides.Side) -> None:
    """Delete what a cell left behind (keys, rows, jobs of its namespace)."""
    pattern = f"{side.namespace}%"
    try:
        if target.monitor is not None:
            for host, port in target.monitor.masters:
                client = redis.asyncio.Redis(host=host, port=port)
                try:
                    async for name in client.scan_iter(match=f"*{side.namespace}*", count=1000):
                        await client.delete(name)  # one key per DEL: a cluster's keys differ
                finally:
                    await client.aclose()
        elif target.series == sides.PROCRASTINATE:
            await count.delete_jobs(target.url, side.queue)
        else:
            await count.delete_rows(target.url, pattern)
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"inbox-scale: clean-up of {side.namespace} failed: {exc!r}")


async def _series(target: Target, cfg: Config, workers: tuple[int, ...]) -> list[Cell]:
    """Every cell of one series: trickle and backlog per worker count."""
    events, keys = (QUICK_EVENTS, QUICK_KEYS) if cfg.quick else (EVENTS, KEYS)
    modes = [("trickle", events, keys)] + ([] if cfg.quick else [("backlog", events, events)])
    cells = []
    for w in workers:
        for mode, n, k in modes:
            log(f"inbox-scale: {LABEL[target.series]}, {w} worker(s), {mode}")
            cell, work = await run_cell(target, cfg, w, mode, n, k)
            if target.admin_url and not cell.error:  # less the same cell without the events
                null, base = await run_cell(target, cfg, w, mode, 0, k)
                work -= base
                cell.error = null.error
            cell.cost = work / n if not cell.error else float("nan")
            cells.append(cell)
            log(
                f"inbox-scale:   {fmt(cell.cost, 2)} {target.unit}/event, "
                f"{fmt(cell.events_s, 0)} events/s, p50/p99 {fmt(cell.p50_ms, 1)}/"
                f"{fmt(cell.p99_ms, 1)} ms, order held {cell.order_held}, lost {cell.lost}, "
                f"{cell.seconds:.1f} s"
            )
    return cells


async def _extras(cfg: Config, target: Target) -> list[tuple[str, str]]:
    """PostgreSQL: one worker draining a backlog over 20 keys; accepts from 8 producers."""
    events = QUICK_EVENTS if cfg.quick else EVENTS
    cell, work = await run_cell(target, cfg, 1, "backlog", events, 20)
    null, base = await run_cell(target, cfg, 1, "backlog", 0, 20)
    rows = [
        (
            f"PostgreSQL: one worker draining {events} events over 20 keys",
            f"{fmt(cell.events_s, 0)} events/s, {(work - base) / events:.2f} transactions per "
            f"event, order held: {_yes(cell.order_held)}, lost {cell.lost}"
            + (f" ({cell.error or null.error})" if cell.error or null.error else ""),
        )
    ]
    rate, lost = await _concurrent_accepts(cfg, target, events * 2)
    rows.append(
        (
            (
                f"PostgreSQL: `accept` from {PRODUCERS} producer processes while {LISTENING} "
                f"workers drain ({events * 2} events over {PRODUCERS * 25} keys)"
            ),
            f"{fmt(rate, 0)} accepts/s (all accepts, first to last); lost {lost}",
        )
    )
    return rows


async def _concurrent_accepts(cfg: Config, target: Target, events: int) -> tuple[float, int]:
    namespace = cfg.key("scale", "producers")
    side = sides.Side(target.series, target.url, namespace)
    workers, producers = Children(), Children()
    go, stop = workers.ctx.Event(), workers.ctx.Event()
    start_producing = producers.ctx.Event()
    collector = sides.Collector(workers)
    per = events // PRODUCERS
    try:
        workers.start(sides.worker_main, [(side, i, go, stop) for i in range(LISTENING)])
        await collector.until(lambda: collector.ready == LISTENING, 180, "workers ready")
        go.set()
        producers.start(
            sides.producer_main,
            [
                (side, i, [f"p{i}-{k}" for k in range(25)], per, start_producing)
                for i in range(PRODUCERS)
            ],
        )
        ready = await asyncio.to_thread(producers.collect, "ready", PRODUCERS, 180)
        assert len(ready) == PRODUCERS
        start_producing.set()
        spans = await asyncio.to_thread(producers.collect, "accepted", PRODUCERS, 300)
        wanted = [f"p{i}-{n}" for i in range(PRODUCERS) for n in range(per)]
        await collector.until(lambda: all(m in collector.handled for m in wanted), 300, "drain")
        rate = PRODUCERS * per / (max(s[3] for s in spans) - min(s[2] for s in spans))
        lost = sum(1 for m in wanted if m not in collector.handled)
    except (RuntimeError, TimeoutError) as exc:
        log(f"inbox-scale: concurrent accepts: {exc}")
        rate, lost = float("nan"), -1
    finally:
        stop.set()
        await asyncio.to_thread(producers.join)
        await asyncio.to_thread(workers.join)
        collector.close()
    await _clean(target, side)
    return rate, lost


def _yes(flag: bool) -> str:
    return "yes" if flag else "**no**"


# -- the run, its record and its report ------------------------------------------------------


async def _targets(cfg: Config, chosen: list[str]) -> list[Target]:
    """The chosen series' servers, counter attached (a series whose server is down is left
    out)."""
    cluster = configured_url()
    bench = count.database_url(PG_URL, count.BENCH_DB)
    targets = []
    for series in (s for s in SERIES if s in chosen):
        try:
            if series in ("redis", sides.STREAMS, "redis-cluster"):
                url = cluster if series == "redis-cluster" else cfg.url
                monitor = count.MonitorFiles(await count.masters_of(url))
                targets.append(Target(series, url, monitor=monitor))
            elif series in ("postgres", sides.PROCRASTINATE):
                await count.ensure_database(PG_URL)
                if series == sides.PROCRASTINATE:
                    await count.prepare_procrastinate(bench)
                targets.append(Target(series, bench, admin_url=PG_URL))
            else:
                count.count_mysql_statements()  # the producer's statements, in this process
                targets.append(Target(series, MYSQL_URL))
        except Exception as exc:  # noqa: BLE001, PERF203 (reported: the series is left out)
            log(f"inbox-scale: {series} left out: {exc!r}")
    return targets


async def _warm_schema(target: Target, cfg: Config) -> None:
    """One cell of one event first, so that no measured cell creates the tables."""
    if target.series in ("postgres", "mysql"):
        await run_cell(target, cfg, 1, "backlog", 1, 1)


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("inbox-scale", f"skipped: {api}\n")
    workers = QUICK_WORKERS if cfg.quick else WORKERS
    chosen = [s for s in os.environ.get(SERIES_ENV, "").split(",") if s] or list(SERIES)
    started, load = now_utc(), os.getloadavg()
    record: dict[str, Any] = {
        "asynclock": _asynclock_commit(),
        "started": started,
        "quick": cfg.quick,
        "load": [round(x, 2) for x in load],
        "cells": [],
        "extras": [],
    }
    for target in await _targets(cfg, chosen):
        if target.monitor is not None:
            target.monitor.start()
        try:
            await _warm_schema(target, cfg)
            record["cells"] += [asdict(c) for c in await _series(target, cfg, workers)]
            if target.series == "postgres" and not cfg.quick:
                record["extras"] += [list(row) for row in await _extras(cfg, target)]
        finally:
            if target.monitor is not None:
                target.monitor.stop()
        if cfg.write:  # after every series: a run cut short keeps what it measured
            _save(record)
    here = [r for r in stored() if r["asynclock"] == record["asynclock"]] if cfg.write else []
    return Section("inbox-scale", _body([*_others(record), *(here or [record])], record))


def _others(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in stored() if r["asynclock"] != record["asynclock"]]


def _save(record: dict[str, Any]) -> None:
    """Store ``record``'s cells in the run of its commit (replacing those of the same series,
    so runs of different series, even at once, add up) and redraw the plot."""
    record["load"] = record["load"][:3] + [round(x, 2) for x in os.getloadavg()]
    with (Path(tempfile.gettempdir()) / "asynclock-inbox-scale.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run of other series may be saving
        same = [r for r in stored() if r["asynclock"] == record["asynclock"]]
        merged = dict(record)
        if same and same[0].get("quick") == record["quick"]:
            mine = {c["series"] for c in record["cells"]}
            kept = [c for c in same[0]["cells"] if c["series"] not in mine]
            merged["cells"] = kept + record["cells"]
            merged["extras"] = record["extras"] or same[0].get("extras", [])
            merged["started"] = min(same[0]["started"], record["started"])
        runs = [*_others(record), merged]
        RESULTS.write_text(dump({"format": 1, "runs": runs}, 4) + "\n")
    log(f"inbox-scale: wrote {RESULTS}")


def _asynclock_commit() -> str:
    """The last commit that changed ``asynclock/`` (and whether it has uncommitted changes)."""
    commit = git("log", "-1", "--format=%h", "--", "asynclock")
    dirty = git("status", "--porcelain", "--", "asynclock")
    return commit + ("+changes" if dirty else "")


def stored() -> list[dict[str, Any]]:
    """Every run stored in :data:`RESULTS`, oldest first."""
    try:
        loaded = json.loads(RESULTS.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return list(loaded.get("runs", [])) if isinstance(loaded, dict) else []


def cells_of(run: dict[str, Any]) -> list[Cell]:
    return [Cell(**c) for c in run.get("cells", [])]


def _body(runs: list[dict[str, Any]], this: dict[str, Any]) -> str:
    """The doc block: how it is measured, then the tables of every stored run, this one last."""
    parts = [
        kept("inbox-scale-intro"),
        "![Server work per event and events/s against workers](img/inbox-scale.png)",
    ]
    for run in runs:
        cells = cells_of(run)
        load = run.get("load") or []
        kind = "quick run" if run.get("quick") else "full run"
        parts.append(
            f"#### asynclock at `{run['asynclock']}`: {kind} of {run['started']}"
            + (f" (load average {load[0]:.1f} on 2 cores at the start)" if load else "")
            + (" (this run)" if run["asynclock"] == this["asynclock"] else "")
        )
        for series in SERIES:
            mine = [c for c in cells if c.series == series]
            if mine:
                parts.append(f"**{LABEL[series]}**, {UNIT[series]} per event:")
                parts.append(_table(mine))
        if run.get("extras"):
            parts.append(kv_table([(str(k), str(v)) for k, v in run["extras"]]))
    return "\n\n".join(parts)


def _table(cells: list[Cell]) -> str:
    head = (
        "| workers | trickle: per event | events/s | p50 / p99 ms | backlog: per event | "
        "events/s | p50 / p99 ms | order held, lost, redelivered |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for w in sorted({c.workers for c in cells}):
        row = [str(w)]
        notes = []
        for mode in ("trickle", "backlog"):
            cell = next((c for c in cells if c.workers == w and c.mode == mode), None)
            if cell is None or (cell.error and math.isnan(cell.events_s)):
                row += ["failed" if cell else "", "", ""]
                if cell is not None:
                    notes.append(cell.error)
                continue
            row += [
                fmt(cell.cost, 2),
                fmt(cell.events_s, 0),
                f"{fmt(cell.p50_ms, 1)} / {fmt(cell.p99_ms, 1)}",
            ]
            notes.append(
                f"{mode}: {_yes(cell.order_held)}, {cell.lost}, {cell.redelivered}"
                + (f" ({cell.error})" if cell.error else "")
            )
        lines.append("| " + " | ".join([*row, "; ".join(notes)]) + " |")
    return "\n".join(lines)


SCENARIO = Scenario("inbox-scale", run, own_environment=True)
