"""Scenario ``cluster``: aggregate lock throughput over many keys, single Redis vs Redis Cluster.

The worker processes are spawned once for the whole scenario (both states open and warmed in
each) and told what to run through a queue, so a round costs no interpreter start-up. The
workload and what it can show on this machine: docs/benchmarks.md, the ``cluster`` block.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from benchmarks.harness import progress as _progress
from benchmarks.harness.env import (
    Asynclock,
    Config,
    commit,
    log,
    now_utc,
    require_asynclock,
)
from benchmarks.harness.report import Column, Headlines, Rounds, Section, kept, record_data, table
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.servers import (
    SETTINGS,
    cluster_url,
    delete_cluster_keys,
    masters,
)
from benchmarks.harness.spawn import Children
from benchmarks.harness.stats import fmt

PROCESS_COUNTS = (1, 2, 4)
TASKS = 4  # per process
KEYS = 10_000
WINDOW, QUICK_WINDOW = 3.0, 1.5  # seconds of each measurement
TTL = 30.0
#: a round during which something else kept more than this many cores busy is measured again
#: (at most twice as many times as there are rounds; the section says how many were discarded)
DISTURBED = 0.3
SINGLE = "single Redis"
CLUSTER = "Redis Cluster, 3 masters"


def label(target: str, processes: int) -> str:
    return f"{target}, {processes} process{'es' if processes > 1 else ''} x {TASKS} tasks"


# --- the worker processes ---------------------------------------------------------------------


@dataclass(frozen=True)
class ChildArgs:
    index: int
    urls: dict[str, str]  # target name -> state URL
    prefix: str
    key_root: str


async def _pairs(lock_cls: Any, state: Any, keys: list[str], end: float) -> int:
    done = 0
    clock = time.perf_counter
    i, n = 0, len(keys)
    while clock() < end:
        async with lock_cls(state, keys[i], ttl=TTL):
            pass
        done += 1
        i = i + 1 if i + 1 < n else 0
    return done


async def _child(args: ChildArgs, commands: Any, out: Any) -> None:
    api = require_asynclock()
    lock_cls = api.lock_factory()
    states = {name: api.redis_state(url, args.prefix) for name, url in args.urls.items()}
    keys = [f"{args.key_root}:k{i}" for i in range(KEYS)]
    try:
        for state in states.values():  # connections and scripts on every master
            warm = [f"{args.key_root}:warm:{args.index}:{i}" for i in range(64)]
            for _ in range(2):
                for key in warm:
                    async with lock_cls(state, key, ttl=TTL):
                        pass
        out.put(("ready", args.index))
        while True:
            command = await asyncio.to_thread(commands.get)
            if command is None:
                return
            target, processes, start_at, window = command
            # task j of process p takes keys p + N*j, p + N*j + N*TASKS, ...: never shared
            slices = [keys[args.index + processes * j :: processes * TASKS] for j in range(TASKS)]
            await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
            cpu0 = time.process_time()
            counts = await asyncio.gather(
                *(_pairs(lock_cls, states[target], s, start_at + window) for s in slices)
            )
            ended = time.perf_counter()
            out.put(("done", args.index, sum(counts), ended, time.process_time() - cpu0))
    finally:
        for state in states.values():
            await state.aclose()


def child_main(args: ChildArgs, commands: Any, out: Any) -> None:
    """Entry point of a spawned worker."""
    try:
        asyncio.run(_child(args, commands, out))
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", args.index, traceback.format_exc(limit=6)))


class Workers(Children):
    """``count`` spawned workers, each with its own command queue and one shared reply queue."""

    def __init__(self, cfg: Config, urls: dict[str, str], count: int) -> None:
        super().__init__()
        key_root = cfg.key("cluster")
        args = [(ChildArgs(i, urls, cfg.prefix, key_root),) for i in range(count)]
        self.start(child_main, args, commands=True)

    def run(self, target: str, processes: int, window: float) -> dict[str, float]:
        """One measurement: the first ``processes`` workers on ``target`` for ``window`` s."""
        start_at = time.perf_counter() + 0.2
        for i in range(processes):
            self.send(i, (target, processes, start_at, window))
        done = self.collect("done", processes, window + 60)
        pairs = sum(int(msg[2]) for msg in done)
        elapsed = max(float(msg[3]) for msg in done) - start_at
        cpu = sum(float(msg[4]) for msg in done)
        return {
            "pairs_s": pairs / elapsed,
            "pairs": float(pairs),
            "client_cpu_us": cpu / max(pairs, 1) * 1e6,
        }


# --- servers: CPU, cleanup ----------------------------------------------------------------------


async def _cpu_seconds(clients: list[redis.asyncio.Redis]) -> float:
    total = 0.0
    for client in clients:
        info = await client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``; 0.0 where there is none)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


# --- the scenario ---------------------------------------------------------------------------


async def run(cfg: Config, api: Asynclock | str) -> Section:
    """The scenario: see the module's docstring."""
    with contextlib.ExitStack() as stack:
        url, why = cluster_url(stack, "cluster")
        private = SETTINGS.private and SETTINGS.url is None
        return await _run(cfg, api, url, private=private, why=why)


async def _run(
    cfg: Config, api: Asynclock | str, cluster_url: str | None, *, private: bool, why: str = ""
) -> Section:
    rounds_n = cfg.rounds_or(5, 2)
    window = QUICK_WINDOW if cfg.quick else WINDOW
    rounds = Rounds()
    for n in PROCESS_COUNTS:
        rounds.declare(label(SINGLE, n))
        rounds.declare(label(CLUSTER, n))
    facts: dict[str, str] = {}
    if isinstance(api, str):
        for variant in rounds.variants:
            rounds.skip(variant, api)
        return _section(cfg, rounds, rounds_n, window, cluster_url, private, facts, now_utc())
    servers: dict[str, list[redis.asyncio.Redis]] = {
        SINGLE: [redis.asyncio.Redis.from_url(cfg.url)]
    }
    urls = {SINGLE: cfg.url}
    facts["asynclock"] = "git " + commit(" + uncommitted changes in asynclock/")
    if cluster_url is not None:
        try:
            servers[CLUSTER] = await masters(cluster_url)
            info = await servers[CLUSTER][0].info("server")
            facts["cluster"] = f"{len(servers[CLUSTER])} masters, redis {info.get('redis_version')}"
            urls[CLUSTER] = cluster_url
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            why = f"cluster at {cluster_url} not reachable ({type(exc).__name__}: {exc})"
    if CLUSTER not in urls:
        log(f"cluster: cluster rows skipped: {why}")
        for n in PROCESS_COUNTS:
            rounds.skip(label(CLUSTER, n), why)
    configs = [(target, n) for n in PROCESS_COUNTS for target in urls]
    started = now_utc()
    workers = Workers(cfg, urls, max(PROCESS_COUNTS))
    try:
        workers.collect("ready", max(PROCESS_COUNTS), 120)
        discarded = 0
        with _progress.step("cluster rounds", rounds_n) as bar:
            attempt = 0
            while rounds.rounds_of(rounds.variants[0]) < rounds_n:
                shift = attempt % len(configs)
                attempt += 1
                order = configs[shift:] + configs[:shift]
                per_round = await _round(workers, servers, order, window)
                _ratios(per_round, urls)
                summary = ", ".join(
                    f"{t.split(',')[0]} N={n}: {per_round[label(t, n)]['pairs_s']:,.0f}/s"
                    for n in PROCESS_COUNTS
                    for t in urls
                )
                other = max(m["other_cpus"] for m in per_round.values())
                if other > DISTURBED and discarded < 2 * rounds_n:
                    discarded += 1
                    log(f"cluster: round discarded, other CPU load {other:.2f} cores: {summary}")
                    continue
                for variant in rounds.variants:
                    if variant in per_round:
                        rounds.add(variant, per_round[variant])
                done = rounds.rounds_of(rounds.variants[0])
                log(f"cluster round {done}/{rounds_n}: {summary}")
                bar.advance()
        facts["discarded"] = str(discarded)
    except RuntimeError as exc:
        log(f"cluster: stopped: {exc}")
        for variant in rounds.variants:
            rounds.skip(variant, str(exc).splitlines()[0])
    finally:
        await asyncio.to_thread(workers.join)
        if CLUSTER in servers and not private:
            deleted = await delete_cluster_keys(servers[CLUSTER], cfg.run_id)
            log(f"cluster: deleted {deleted} key(s) of run {cfg.run_id} from the cluster")
        for clients in servers.values():
            for client in clients:
                await client.aclose()
    record_data("setup", {"tasks": TASKS, "keys": KEYS, "window_s": window, **facts})
    return _section(cfg, rounds, rounds_n, window, cluster_url, private, facts, started)


async def _round(
    workers: Workers,
    servers: dict[str, list[redis.asyncio.Redis]],
    order: list[tuple[str, int]],
    window: float,
) -> dict[str, dict[str, float]]:
    """One measurement of every (server, N), in ``order``."""
    per_round: dict[str, dict[str, float]] = {}
    for target, n in order:
        await asyncio.sleep(0.2)  # let the previous run's tail settle
        cpu0, busy0 = await _cpu_seconds(servers[target]), _machine_busy()
        t0 = time.perf_counter()
        metrics = await asyncio.to_thread(workers.run, target, n, window)
        cpu = await _cpu_seconds(servers[target]) - cpu0
        busy, spent = _machine_busy() - busy0, time.perf_counter() - t0
        pairs = max(metrics["pairs"], 1.0)
        metrics["server_cpu_us"] = cpu / pairs * 1e6
        # the machine's busy CPU not spent by the workers or the server(s): the parent
        # (little) and anything else running (a test suite, another benchmark)
        ours = cpu + metrics["client_cpu_us"] * pairs / 1e6
        metrics["other_cpus"] = max(0.0, busy - ours) / spent
        per_round[label(target, n)] = metrics
    return per_round


def _ratios(per_round: dict[str, dict[str, float]], urls: dict[str, str]) -> None:
    """Add the within-round ratios: ÷ 1 process (same server), cluster ÷ single (same N)."""
    for target in urls:
        one = per_round[label(target, 1)]["pairs_s"]
        for n in PROCESS_COUNTS:
            per_round[label(target, n)]["x_one"] = per_round[label(target, n)]["pairs_s"] / one
    if CLUSTER in urls:
        for n in PROCESS_COUNTS:
            mine = per_round[label(CLUSTER, n)]
            mine["x_single"] = mine["pairs_s"] / per_round[label(SINGLE, n)]["pairs_s"]


def _section(
    cfg: Config,
    rounds: Rounds,
    rounds_n: int,
    window: float,
    cluster_url: str | None,
    private: bool,
    facts: dict[str, str],
    started: str,
) -> Section:
    cols = [
        Column("lock pairs/s (all processes)", "pairs_s"),
        Column("cluster ÷ single Redis", "x_single", 2),
        Column("÷ 1 process (same server)", "x_one", 2),
        Column("client CPU µs per pair", "client_cpu_us", 1),
        Column("server CPU µs per pair (all masters)", "server_cpu_us", 1),
        Column("other CPU load (cores)", "other_cpus", 2),
    ]
    where = "private throwaway" if private else "shared"
    cluster = (
        f"`{cluster_url}` ({where}; {facts.get('cluster', 'not reached')})"
        if cluster_url
        else "none (rows skipped)"
    )
    body = [
        "## Cluster: lock throughput over many keys, single Redis vs Redis Cluster",
        "",
        (
            f"N worker processes (multiprocessing spawn, N = "
            f"{', '.join(str(n) for n in PROCESS_COUNTS)}), each with {TASKS} tasks doing "
            f"`async with AsyncLock(state, key, ttl={TTL:g}): pass` back to back over "
            f"{KEYS:,} distinct keys (dealt so that no two tasks share a key: no contention, "
            f"only independent locks) for {window:g} s; lock pairs/s is every pair of every "
            f"process over the time from the common start to the last pair's end. The same "
            f"workers (spawned once, both states open and warmed) run against the single Redis "
            f"`{cfg.url}` and the cluster {cluster}. {rounds_n} rounds, the "
            f"{len(PROCESS_COUNTS) * 2} (server, N) runs interleaved with the starting one "
            f"rotating; ratios are taken within each round. A round during which other "
            f"processes kept more than {DISTURBED:g} of a core busy (the last column) is "
            f"measured again, at most {2 * rounds_n} times: "
            f"{facts.get('discarded', '0')} round(s) discarded in this run. "
            f"Started {started}; asynclock "
            f"{facts.get('asynclock', 'not run')}; the machine of the environment above."
        ),
        "",
        table(rounds, cols),
        "",
        kept("cluster-columns"),
        (
            f"- **What this machine can and cannot show.** It has {os.cpu_count()} CPUs, and "
            "the three masters, the single server and the N client processes all share them. "
            "A cluster scales out by putting masters on *separate* machines (or at least "
            "separate cores); here it cannot add CPU, so these rows do not measure horizontal "
            "scaling. They measure what the cluster costs: the client-side slot routing "
            "(one pool per master, each pair's two scripts sent to the slot's master) and "
            "three servers sharing the cores one server had. On hardware with a core per "
            "master and per client the cluster column is expected to grow with N where the "
            "single server's is capped by its one command thread; whether and how much it does "
            "is not measured here."
        ),
    ]
    headlines = Headlines()
    for n in PROCESS_COUNTS:
        single = rounds.spread(label(SINGLE, n), "pairs_s")
        clustered = rounds.spread(label(CLUSTER, n), "pairs_s")
        if rounds.spread(label(CLUSTER, n), "x_single").count:
            what = f"Redis Cluster ÷ single Redis, {label('', n).lstrip(', ')}, {KEYS:,} keys"
            note = f" ({fmt(clustered.median, 0)} vs {fmt(single.median, 0)} pairs/s)"
            headlines.metric(what, rounds, label(CLUSTER, n), "x_single", 2, note=note)
    return Section("cluster", "\n".join(body), headlines.rows)


SCENARIO = Scenario("cluster", run, own_environment=True)
