"""Scenario ``contended``: 16 tasks x 100 cycles on one key, and 3 processes x 6 tasks."""

from __future__ import annotations

import asyncio
import gc
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from benchmarks import _procs
from benchmarks._contend import Contender, Outcome, analyze, contend, contend_threads
from benchmarks._env import Asynclock, CommandCounter, Config, StateLike, log, now_utc, short
from benchmarks._report import Column, Rounds, Section, table
from benchmarks._stats import fmt, fmt_spread

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

WORKERS = 16
CYCLES = 100
PROCESSES = 3
TASKS_PER_PROCESS = 6

IDEAL = "asyncio.Lock (in-process ideal)"
ASYNCLOCK = "**asynclock** AsyncLock (RedisState)"
REDISPY = "redis-py asyncio Lock, sleep=0.1 (default)"
REDISPY_FAST = "redis-py asyncio Lock, sleep=0.001"
PRL = "python-redis-lock, 16 threads (BLPOP wake-up)"
P_ASYNCLOCK = f"**asynclock**, {PROCESSES} processes x {TASKS_PER_PROCESS} tasks"
P_REDISPY = f"redis-py Lock sleep=0.1, {PROCESSES} processes x {TASKS_PER_PROCESS} tasks"


class AsyncioLockContender:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    async def acquire(self) -> Any:
        await self.lock.acquire()

    async def release(self, handle: Any) -> None:
        self.lock.release()


class AsynclockContender:
    def __init__(self, api: Asynclock, state: StateLike, key: str) -> None:
        self.lock_cls, self.state, self.key = api.lock_factory(), state, key

    async def acquire(self) -> Any:
        lock = self.lock_cls(self.state, self.key, ttl=30.0)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


class RedisPyContender:
    def __init__(self, client: redis.asyncio.Redis, key: str, sleep: float) -> None:
        self.client, self.key, self.sleep = client, key, sleep

    async def acquire(self) -> Any:
        lock = self.client.lock(self.key, timeout=30, sleep=self.sleep)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


async def run(cfg: Config, api: Asynclock | str) -> Section:
    rounds_n = cfg.rounds_or(5, 2)
    timeout = 60.0 if cfg.quick else 120.0
    monitor = redis.asyncio.Redis.from_url(cfg.url)
    counter = CommandCounter(monitor)
    single, multi = Rounds(), Rounds()
    for name in (IDEAL, ASYNCLOCK, REDISPY, REDISPY_FAST, PRL):
        single.declare(name)
    for name in (P_ASYNCLOCK, P_REDISPY):
        multi.declare(name)

    closers: list[Callable[[], Awaitable[None]]] = [monitor.aclose]
    runners: dict[str, Callable[[], Awaitable[tuple[Outcome | None, int | None, str | None]]]] = {}

    def in_process(contender: Contender) -> Callable[[], Awaitable[Any]]:
        async def go() -> tuple[Outcome | None, int | None, str | None]:
            await counter.start()
            outcome = await contend(contender, workers=WORKERS, cycles=CYCLES, timeout=timeout)
            return outcome, await counter.stop(), None

        return go

    async def warm(name: str, contender: Contender) -> bool:
        outcome = await contend(contender, workers=WORKERS, cycles=2, timeout=30)
        if outcome.timed_out:
            single.skip(name, "warm-up (16 tasks x 2 cycles) timed out")
            return False
        return True

    runners[IDEAL] = in_process(AsyncioLockContender())

    client = redis.asyncio.Redis.from_url(cfg.url)
    closers.append(client.aclose)
    for name, sleep, tag in ((REDISPY, 0.1, "redis-py"), (REDISPY_FAST, 0.001, "redis-py-fast")):
        contender = RedisPyContender(client, cfg.key("contended", tag), sleep)
        if await warm(name, contender):
            runners[name] = in_process(contender)

    if isinstance(api, str):
        single.skip(ASYNCLOCK, api)
        multi.skip(P_ASYNCLOCK, api)
    else:
        try:
            state = api.redis_state(cfg.url, cfg.prefix)
            closers.append(state.aclose)
            contender_a = AsynclockContender(api, state, cfg.key("contended", "asynclock"))
            if await warm(ASYNCLOCK, contender_a):
                runners[ASYNCLOCK] = in_process(contender_a)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            single.skip(ASYNCLOCK, f"{type(exc).__name__}: {exc}")
            log(f"contended: asynclock skipped: {exc!r}")

    try:
        import redis_lock
    except ImportError as exc:
        single.skip(PRL, f"python-redis-lock not installed ({exc})")
    else:
        sync_client = redis.Redis.from_url(cfg.url)
        prl_key = cfg.key("contended", "python-redis-lock")

        def make_prl() -> Any:
            return redis_lock.Lock(sync_client, prl_key, expire=30)

        async def run_prl() -> tuple[Outcome | None, int | None, str | None]:
            await counter.start()
            outcome = contend_threads(make_prl, workers=WORKERS, cycles=CYCLES, timeout=timeout)
            return outcome, await counter.stop(), None

        async def close_sync() -> None:
            sync_client.close()

        closers.append(close_sync)
        contend_threads(make_prl, workers=WORKERS, cycles=2, timeout=30)
        runners[PRL] = run_prl

    def multi_runner(variant: str, tag: str) -> Callable[[], Awaitable[Any]]:
        async def go() -> tuple[Outcome | None, int | None, str | None]:
            result = await _procs.run_processes(
                url=cfg.url,
                prefix=cfg.prefix,
                variant=variant,
                key=cfg.key("contended", tag),
                processes=PROCESSES,
                tasks=TASKS_PER_PROCESS,
                cycles=CYCLES,
                counter=counter,
                timeout=timeout,
            )
            return result.outcome, result.commands, result.error

        return go

    if not isinstance(api, str):
        runners[P_ASYNCLOCK] = multi_runner(_procs.ASYNCLOCK, "procs-asynclock")
    runners[P_REDISPY] = multi_runner(_procs.REDISPY, "procs-redis-py")

    started = now_utc()
    names = list(runners)
    try:
        for r in range(rounds_n):
            per_round: dict[str, dict[str, float]] = {}
            if not names:
                break
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                target = multi if name in (P_ASYNCLOCK, P_REDISPY) else single
                workers = PROCESSES * TASKS_PER_PROCESS if target is multi else WORKERS
                gc.collect()
                try:
                    outcome, commands, error = await runners[name]()
                except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                    outcome, commands, error = None, None, f"{type(exc).__name__}: {exc}"
                if outcome is None or outcome.timed_out:
                    reason = error or f"timed out after {timeout:.0f} s"
                    target.skip(name, reason.splitlines()[0] if reason else "failed")
                    log(f"contended: {name} round {r + 1} failed, dropped: {reason}")
                    names.remove(name)  # a variant that failed once is not run again
                    continue
                metrics = analyze(
                    outcome.events,
                    workers=workers,
                    started=outcome.started,
                    counter_violations=outcome.counter_violations,
                )
                metrics["cmds_cycle"] = (commands or 0) / max(1.0, metrics.get("cycles", 1.0))
                per_round[name] = metrics
                target.add(name, metrics)
            ideal = per_round.get(IDEAL)
            for metrics in per_round.values():
                if ideal is not None:
                    metrics["x_ideal"] = metrics["cycles_s"] / ideal["cycles_s"]
                for ref, tag in (
                    (REDISPY, "redispy"),
                    (REDISPY_FAST, "redispy_fast"),
                    (PRL, "prl"),
                ):
                    if ref in per_round:
                        metrics[f"x_{tag}"] = metrics["cycles_s"] / per_round[ref]["cycles_s"]
                if P_REDISPY in per_round:
                    metrics["x_p_redispy"] = metrics["cycles_s"] / per_round[P_REDISPY]["cycles_s"]
            summary = ", ".join(f"{short(k)}: {m['cycles_s']:,.0f}/s" for k, m in per_round.items())
            log(f"contended round {r + 1}/{rounds_n}: {summary}")
    finally:
        for close in closers:
            try:
                await close()
            except Exception as exc:  # noqa: BLE001, PERF203 (reported, never fatal)
                log(f"contended: close failed: {exc!r}")
    return _section(cfg, single, multi, rounds_n, started)


def _section(cfg: Config, single: Rounds, multi: Rounds, rounds_n: int, started: str) -> Section:
    main_cols = [
        Column("cycles/s", "cycles_s"),
        Column("÷ asyncio.Lock", "x_ideal", 4),
        Column("handoff p50 ms (all)", "h_p50", 3),
        Column("handoff p99 ms (all)", "h_p99", 3),
        Column("cross-worker handoff p50 ms", "xh_p50", 3),
        Column("cross-worker handoff p99 ms", "xh_p99", 3),
        Column("cross-worker handoffs / run", "xh_count"),
    ]
    wait_cols = [
        Column("acquire wait p50 ms", "w_p50", 3),
        Column("acquire wait p99 ms", "w_p99", 1),
        Column("acquire wait max ms", "w_max", 1),
        Column("min acquisitions per worker*", "fair_min"),
        Column("max acquisitions per worker*", "fair_max"),
        Column("longest same-worker streak", "streak"),
        Column("Redis commands per cycle", "cmds_cycle", 2),
    ]
    excl_cols = [
        Column("counter violations", "violations"),
        Column("interval overlaps", "overlaps"),
        Column("cycles / run", "cycles"),
    ]
    multi_cols = [
        Column("cycles/s", "cycles_s"),
        Column("÷ same-run redis-py (3 procs)", "x_p_redispy", 2),
        Column("cross-process handoff p50 ms", "xg_p50", 3),
        Column("cross-process handoff p99 ms", "xg_p99", 3),
        Column("cross-process handoffs / run", "xg_count"),
        Column("cross-worker handoff p50 ms", "xh_p50", 3),
        Column("acquire wait p99 ms", "w_p99", 1),
        Column("acquire wait max ms", "w_max", 1),
        Column("longest same-worker streak", "streak"),
        Column("Redis commands per cycle", "cmds_cycle", 2),
        Column("counter violations", "violations"),
        Column("interval overlaps", "overlaps"),
    ]
    body = [
        f"## Contended: {WORKERS} tasks x {CYCLES} cycles on one key",
        "",
        (
            f"{rounds_n} rounds, variants interleaved round-robin (the starting variant rotates). "
            f"Cells: median (min-max) over the rounds. Started {started} against `{cfg.url}`."
        ),
        "",
        table(single, main_cols),
        "",
        "### Acquire wait, fairness and server load",
        "",
        table(single, wait_cols),
        "",
        (
            "\\* acquisitions per worker counted while every worker was still competing, i.e. up to "
            "the moment the first worker finished its 100 cycles (every worker does 100 in all). A "
            "FIFO-fair lock gives about 99-100 / 100; a lock that lets its holder re-take it gives "
            "0 / 100."
        ),
        "",
        "### Mutual exclusion",
        "",
        table(single, excl_cols),
        "",
        (
            f"### {PROCESSES} processes x {TASKS_PER_PROCESS} tasks x {CYCLES} cycles on one key "
            "(multiprocessing, spawn)"
        ),
        "",
        (
            "Each child warms up on its own key, reports ready, and all start on one signal. The "
            "children send back their timestamped cycles and the parent merges them."
        ),
        "",
        table(multi, multi_cols),
        "",
        "Definitions (as in the peer study):",
        (
            "- **handoff**: the next successful `acquire()` return minus the moment the previous "
            "holder left the critical section (just before `release()`), so it includes the "
            "release round trip. **Cross-worker** leaves out a worker re-taking the lock it just "
            "released; **cross-process** counts only handoffs to another process."
        ),
        "- **acquire wait**: from the `acquire()` call to its return.",
        (
            "- **Redis commands per cycle**: the `INFO stats` `total_commands_processed` delta "
            "(less the INFO call) over the timed run, divided by the cycles. It counts commands "
            "run inside Lua scripts and those of every other client of the shared server; the "
            "asyncio.Lock row shows that background."
        ),
        (
            "- the critical section: an in-section counter is incremented, `await asyncio.sleep(0)` "
            "(threads: `time.sleep(0)`) yields, the counter is decremented; a counter above 1 is a "
            "violation. Interval overlaps: [acquired, left] intervals of different cycles that "
            "overlap on the merged timeline (perf_counter is CLOCK_MONOTONIC)."
        ),
        (
            "- asynclock and redis-py use a new lock object per cycle; python-redis-lock runs in "
            "16 OS threads of the same process with a sync client."
        ),
    ]
    headlines: list[tuple[str, str]] = []

    def add(label: str, rounds: Rounds, variant: str, metric: str, digits: int) -> None:
        spread = rounds.spread(variant, metric)
        if spread.count == 0:
            headlines.append((label, "n/a (skipped: see the tables)"))
        else:
            headlines.append((label, f"**{fmt_spread(spread, digits)}**"))

    add("asynclock contended cycles/s (16x100)", single, ASYNCLOCK, "cycles_s", 0)
    add("asynclock ÷ redis-py Lock sleep=0.1, contended throughput", single, ASYNCLOCK,
        "x_redispy", 2)  # fmt: skip
    add("asynclock ÷ redis-py Lock sleep=0.001, contended throughput", single, ASYNCLOCK,
        "x_redispy_fast", 2)  # fmt: skip
    add("asynclock ÷ python-redis-lock (threads), contended throughput", single, ASYNCLOCK,
        "x_prl", 2)  # fmt: skip
    add("asynclock ÷ asyncio.Lock, contended throughput", single, ASYNCLOCK, "x_ideal", 4)
    add("asynclock cross-worker handoff p50 ms", single, ASYNCLOCK, "xh_p50", 3)
    add("asynclock cross-worker handoff p99 ms", single, ASYNCLOCK, "xh_p99", 3)
    add("redis-py (sleep=0.1) cross-worker handoff p50 ms", single, REDISPY, "xh_p50", 3)
    add("python-redis-lock cross-worker handoff p50 ms", single, PRL, "xh_p50", 3)
    add("asynclock acquire wait max ms", single, ASYNCLOCK, "w_max", 1)
    add("asynclock longest same-worker streak", single, ASYNCLOCK, "streak", 0)
    add("asynclock Redis commands per cycle", single, ASYNCLOCK, "cmds_cycle", 2)
    add("asynclock 3 processes: cycles/s", multi, P_ASYNCLOCK, "cycles_s", 0)
    add("asynclock 3 processes ÷ redis-py 3 processes", multi, P_ASYNCLOCK, "x_p_redispy", 2)
    add("asynclock 3 processes: cross-process handoff p50 ms", multi, P_ASYNCLOCK, "xg_p50", 3)
    violations = [
        int(m.get("violations", 0) + m.get("overlaps", 0))
        for r in (single, multi)
        for v in r.variants
        for m in r.data[v]
    ]
    headlines.append(
        ("mutual-exclusion violations, all variants and rounds", fmt(float(sum(violations)), 0))
    )
    return Section("contended", "\n".join(body), headlines)
