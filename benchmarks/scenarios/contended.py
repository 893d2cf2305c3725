"""Scenario ``contended``: 4, 16 and 64 tasks on one key, and 3 processes x 6 tasks.

The same workload (``_contend.contend``: acquire, a critical section with one yield, release)
at every task count; the 64-task rows do fewer cycles per task (``CYCLES``) so that the slow
polling peers stay within a bounded time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio

from benchmarks.harness import spawn as _spawn
from benchmarks.harness.contend import Contender, columns, contend, contend_threads
from benchmarks.harness.contenders import AsyncioLockContender, AsynclockContender, RedisPyContender
from benchmarks.harness.env import Asynclock, CommandCounter, Config, log, now_utc, short
from benchmarks.harness.report import (
    SKIPPED,
    Column,
    Headlines,
    Rounds,
    Section,
    kept,
    table,
    violations,
)
from benchmarks.harness.rounds import ContentionRow, ContentionRun, close_all, contention_rounds
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.stats import fmt, fmt_spread

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

TASK_COUNTS = (4, 16, 64)
# cycles per task at each task count: 64 x 25 keeps the total (1,600 cycles) of 16 x 100, so the
# polling peers (about 0.1 s per owner change at sleep=0.1) finish in seconds, not minutes
CYCLES = {4: 100, 16: 100, 64: 25}
QUICK_CYCLES = {4: 100, 16: 100, 64: 10}
WORKERS = 16  # the task count the targets and the per-variant charts cite
PROCESSES = 3
TASKS_PER_PROCESS = 6
MP_CYCLES = 100

IDEAL = "asyncio.Lock (in-process ideal)"
ASYNCLOCK = "**asynclock** AsyncLock (RedisState)"
REDISPY = "redis-py asyncio Lock, sleep=0.1 (default)"
REDISPY_FAST = "redis-py asyncio Lock, sleep=0.001"
PRL = "python-redis-lock (BLPOP wake-up)"
BASES = (IDEAL, ASYNCLOCK, REDISPY, REDISPY_FAST, PRL)
P_ASYNCLOCK = f"**asynclock**, {PROCESSES} processes x {TASKS_PER_PROCESS} tasks"
P_REDISPY = f"redis-py Lock sleep=0.1, {PROCESSES} processes x {TASKS_PER_PROCESS} tasks"


def label(base: str, tasks: int) -> str:
    """The row label of ``base`` at ``tasks`` workers (threads for python-redis-lock)."""
    return f"{base}, {tasks} {'threads' if base == PRL else 'tasks'}"


async def run(cfg: Config, api: Asynclock | str) -> Section:
    rounds_n = cfg.rounds_or(5, 2)
    cycles = QUICK_CYCLES if cfg.quick else CYCLES
    timeout = 60.0 if cfg.quick else 120.0
    monitor = redis.asyncio.Redis.from_url(cfg.url)
    counter = CommandCounter(monitor)
    sweep = {n: Rounds() for n in TASK_COUNTS}
    multi = Rounds()
    for n in TASK_COUNTS:
        for base in BASES:
            sweep[n].declare(label(base, n))
    for name in (P_ASYNCLOCK, P_REDISPY):
        multi.declare(name)

    closers: list[Callable[[], Awaitable[None]]] = [monitor.aclose]
    rows: dict[str, ContentionRow] = {}

    def in_process(contender: Contender, n: int) -> Callable[[], Awaitable[ContentionRun]]:
        async def go() -> ContentionRun:
            await counter.start()
            outcome = await contend(contender, workers=n, cycles=cycles[n], timeout=timeout)
            return outcome, await counter.stop(), None

        return go

    async def warm(name: str, n: int, contender: Contender) -> bool:
        workers = min(n, 16)
        outcome = await contend(contender, workers=workers, cycles=2, timeout=30)
        if outcome.timed_out:
            sweep[n].skip(name, f"warm-up ({workers} tasks x 2 cycles) timed out")
            return False
        return True

    def add(name: str, n: int, go: Callable[[], Awaitable[ContentionRun]]) -> None:
        rows[name] = ContentionRow(go, sweep[n], n)

    for n in TASK_COUNTS:
        add(label(IDEAL, n), n, in_process(AsyncioLockContender(), n))

    client = redis.asyncio.Redis.from_url(cfg.url, max_connections=2 * max(TASK_COUNTS))
    closers.append(client.aclose)
    for n in TASK_COUNTS:
        for base, sleep, tag in (
            (REDISPY, 0.1, "redis-py"),
            (REDISPY_FAST, 0.001, "redis-py-fast"),
        ):
            contender = RedisPyContender(client, cfg.key("contended", tag, str(n)), sleep)
            if await warm(label(base, n), n, contender):
                add(label(base, n), n, in_process(contender, n))

    if isinstance(api, str):
        for n in TASK_COUNTS:
            sweep[n].skip(label(ASYNCLOCK, n), api)
        multi.skip(P_ASYNCLOCK, api)
    else:
        try:
            state = api.redis_state(cfg.url, cfg.prefix)
            closers.append(state.aclose)
            for n in TASK_COUNTS:
                key = cfg.key("contended", "asynclock", str(n))
                contender_a = AsynclockContender(api.lock_factory(), state, key)
                if await warm(label(ASYNCLOCK, n), n, contender_a):
                    add(label(ASYNCLOCK, n), n, in_process(contender_a, n))
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            for n in TASK_COUNTS:
                sweep[n].skip(label(ASYNCLOCK, n), f"{type(exc).__name__}: {exc}")
            log(f"contended: asynclock skipped: {exc!r}")

    try:
        import redis_lock
    except ImportError as exc:
        for n in TASK_COUNTS:
            sweep[n].skip(label(PRL, n), f"python-redis-lock not installed ({exc})")
    else:
        sync_client = redis.Redis.from_url(cfg.url)

        async def close_sync() -> None:
            sync_client.close()

        closers.append(close_sync)

        def prl_runner(n: int) -> Callable[[], Awaitable[ContentionRun]]:
            prl_key = cfg.key("contended", "python-redis-lock", str(n))

            def make_prl() -> Any:
                return redis_lock.Lock(sync_client, prl_key, expire=30)

            async def run_prl() -> ContentionRun:
                await counter.start()
                outcome = contend_threads(make_prl, workers=n, cycles=cycles[n], timeout=timeout)
                return outcome, await counter.stop(), None

            contend_threads(make_prl, workers=min(n, 16), cycles=2, timeout=30)
            return run_prl

        for n in TASK_COUNTS:
            add(label(PRL, n), n, prl_runner(n))

    def multi_runner(contender: str, tag: str) -> Callable[[], Awaitable[ContentionRun]]:
        async def go() -> ContentionRun:
            result = await _spawn.run_processes(
                contender=contender,
                url=cfg.url,
                prefix=cfg.prefix,
                key=cfg.key("contended", tag),
                processes=PROCESSES,
                tasks=TASKS_PER_PROCESS,
                cycles=MP_CYCLES,
                counter=counter,
                timeout=timeout,
            )
            return result.outcome, result.commands, result.error

        return go

    workers = PROCESSES * TASKS_PER_PROCESS
    if not isinstance(api, str):
        rows[P_ASYNCLOCK] = ContentionRow(multi_runner("redis", "procs-asynclock"), multi, workers)
    rows[P_REDISPY] = ContentionRow(multi_runner(_spawn.REDISPY, "procs-redis-py"), multi, workers)

    started = now_utc()
    try:
        await contention_rounds(
            rows,
            rounds_n=rounds_n,
            timeout=timeout,
            scenario="contended",
            tag=lambda k: f"{short(k.rsplit(', ', 1)[0])} x{rows[k].workers}",
            ratios=_ratios,
        )
    finally:
        await close_all(closers, "contended")
    return _section(cfg, sweep, multi, rounds_n, started, cycles)


def _ratios(per_round: dict[str, dict[str, float]]) -> None:
    """Throughput ratios within one round, against the same task count's references."""
    for n in TASK_COUNTS:
        ideal = per_round.get(label(IDEAL, n))
        for base in BASES:
            metrics = per_round.get(label(base, n))
            if metrics is None:
                continue
            if ideal is not None:
                metrics["x_ideal"] = metrics["cycles_s"] / ideal["cycles_s"]
            for ref, tag in ((REDISPY, "redispy"), (REDISPY_FAST, "redispy_fast"), (PRL, "prl")):
                if label(ref, n) in per_round:
                    theirs = per_round[label(ref, n)]["cycles_s"]
                    metrics[f"x_{tag}"] = metrics["cycles_s"] / theirs
    for name in (P_ASYNCLOCK, P_REDISPY):
        if name in per_round and P_REDISPY in per_round:
            per_round[name]["x_p_redispy"] = (
                per_round[name]["cycles_s"] / per_round[P_REDISPY]["cycles_s"]
            )


def _s(spread: Any, digits: int) -> str:
    return fmt_spread(spread, digits) if spread.count else "n/a"


WHO = (
    (ASYNCLOCK, "asynclock"),
    (REDISPY, "redis-py sleep=0.1"),
    (REDISPY_FAST, "redis-py sleep=0.001"),
    (PRL, "python-redis-lock"),
)


def _glance(sweep: dict[int, Rounds], cycles: dict[int, int]) -> str:
    """asynclock against redis-py at every task count: one column per task count."""
    heads = [f"{n} tasks x {cycles[n]}" for n in TASK_COUNTS]
    lines = ["| metric | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]

    def row(text: str, cells: list[str]) -> None:
        lines.append(f"| {text} | " + " | ".join(cells) + " |")

    def metric(base: str, name: str, digits: int) -> list[str]:
        return [_s(sweep[n].spread(label(base, n), name), digits) for n in TASK_COUNTS]

    row("asynclock cycles/s", metric(ASYNCLOCK, "cycles_s", 0))
    row("asynclock ÷ redis-py sleep=0.1, throughput", metric(ASYNCLOCK, "x_redispy", 2))
    row("asynclock ÷ redis-py sleep=0.001, throughput", metric(ASYNCLOCK, "x_redispy_fast", 2))
    row("asynclock ÷ python-redis-lock (threads), throughput", metric(ASYNCLOCK, "x_prl", 2))
    for base, who in WHO:
        p50, p99 = metric(base, "xh_p50", 3), metric(base, "xh_p99", 3)
        row(
            f"{who}: cross-worker handoff p50 / p99 ms",
            [f"{a} / {b}" for a, b in zip(p50, p99, strict=True)],
        )
    for base, who in WHO:
        row(f"{who}: longest same-worker streak", metric(base, "streak", 0))
    for base, who in WHO[:2]:
        low, high = metric(base, "fair_min", 0), metric(base, "fair_max", 0)
        row(
            f"{who}: min / max acquisitions per worker*",
            [f"{a} / {b}" for a, b in zip(low, high, strict=True)],
        )
    row("asynclock worst acquire wait ms", metric(ASYNCLOCK, "w_max", 1))
    row("redis-py sleep=0.1 worst acquire wait ms", metric(REDISPY, "w_max", 1))
    row("asynclock Redis commands per cycle", metric(ASYNCLOCK, "cmds_cycle", 2))
    row("redis-py sleep=0.1 Redis commands per cycle", metric(REDISPY, "cmds_cycle", 2))
    bad = [violations([sweep[n]]) for n in TASK_COUNTS]
    row("mutual-exclusion violations, every variant and round", [str(b) for b in bad])
    return "\n".join(lines)


def _section(
    cfg: Config,
    sweep: dict[int, Rounds],
    multi: Rounds,
    rounds_n: int,
    started: str,
    cycles: dict[int, int],
) -> Section:
    main_cols = columns(
        "cycles_s",
        Column("÷ asyncio.Lock", "x_ideal", 4),
        Column("÷ redis-py sleep=0.1", "x_redispy", 2),
        "h_p50",
        "h_p99",
        "xh_p50",
        "xh_p99",
        "xh_count",
    )
    wait_cols = columns(
        "w_p50",
        "w_p99",
        "w_max",
        Column("min acquisitions per worker*", "fair_min"),
        Column("max acquisitions per worker*", "fair_max"),
        "streak",
        "cmds_cycle",
        "violations",
        "overlaps",
        "cycles",
    )
    multi_cols = columns(
        "cycles_s",
        Column("÷ same-run redis-py (3 procs)", "x_p_redispy", 2),
        "xg_p50",
        "xg_p99",
        "xg_count",
        "xh_p50",
        "w_p99",
        "w_max",
        "streak",
        "cmds_cycle",
        "violations",
        "overlaps",
    )
    shape = ", ".join(f"{n} x {cycles[n]}" for n in TASK_COUNTS)
    body = [
        f"## Contended: {', '.join(str(n) for n in TASK_COUNTS)} tasks on one key",
        "",
        (
            f"Tasks x cycles per task: {shape}. The 64-task rows do fewer cycles per task so "
            "that the polling peers finish in bounded time (64 x 25 is the same 1,600 cycles as "
            "16 x 100); their per-worker counts are out of that smaller number. "
            f"{rounds_n} rounds, every variant at every task count interleaved round-robin (the "
            "starting variant rotates). Cells: median (min-max) over the rounds; ratios are taken "
            f"within each round against the same task count. Started {started} against "
            f"`{cfg.url}`."
        ),
        "",
        "### The sweep at a glance",
        "",
        _glance(sweep, cycles),
        "",
    ]
    for n in TASK_COUNTS:
        body += [
            f"### {n} tasks x {cycles[n]} cycles",
            "",
            table(sweep[n], main_cols),
            "",
            table(sweep[n], wait_cols),
            "",
        ]
    body += [
        kept("contended-fairness"),
        "",
        (
            f"### {PROCESSES} processes x {TASKS_PER_PROCESS} tasks x {MP_CYCLES} cycles on one "
            "key (multiprocessing, spawn)"
        ),
        "",
        kept("contended-multi"),
        "",
        table(multi, multi_cols),
        "",
        kept("contended-definitions"),
    ]
    headlines = Headlines()
    add = headlines.metric
    s16, me = sweep[WORKERS], label(ASYNCLOCK, WORKERS)
    add("asynclock contended cycles/s (16x100)", s16, me, "cycles_s", 0)
    add("asynclock ÷ redis-py Lock sleep=0.1, contended throughput (16 tasks)", s16, me,
        "x_redispy", 2)  # fmt: skip
    add("asynclock ÷ redis-py Lock sleep=0.001, contended throughput (16 tasks)", s16, me,
        "x_redispy_fast", 2)  # fmt: skip
    add("asynclock ÷ python-redis-lock (threads), contended throughput (16)", s16, me,
        "x_prl", 2)  # fmt: skip
    add("asynclock ÷ asyncio.Lock, contended throughput (16 tasks)", s16, me, "x_ideal", 4)
    add("asynclock cross-worker handoff p50 ms (16 tasks)", s16, me, "xh_p50", 3)
    add("asynclock cross-worker handoff p99 ms (16 tasks)", s16, me, "xh_p99", 3)
    add("redis-py (sleep=0.1) cross-worker handoff p50 ms (16 tasks)", s16,
        label(REDISPY, WORKERS), "xh_p50", 3)  # fmt: skip
    add("python-redis-lock cross-worker handoff p50 ms (16 threads)", s16,
        label(PRL, WORKERS), "xh_p50", 3)  # fmt: skip
    add("asynclock acquire wait max ms (16 tasks)", s16, me, "w_max", 1)
    add("asynclock longest same-worker streak (16 tasks)", s16, me, "streak", 0)
    add("asynclock Redis commands per cycle (16 tasks)", s16, me, "cmds_cycle", 2)
    for n in TASK_COUNTS:
        if n == WORKERS:
            continue
        sw, mine = sweep[n], label(ASYNCLOCK, n)
        slow, fast = sw.spread(mine, "x_redispy"), sw.spread(mine, "x_redispy_fast")
        p50, p99 = sw.spread(mine, "xh_p50"), sw.spread(mine, "xh_p99")
        streak = sw.spread(mine, "streak")
        theirs = sw.spread(label(REDISPY, n), "streak")
        if not slow.count:
            headlines.add(f"asynclock at {n} tasks", SKIPPED)
            continue
        headlines.add(
            f"asynclock at {n} tasks x {cycles[n]}: ÷ redis-py sleep=0.1 / sleep=0.001",
            f"**{_s(slow, 2)}** / **{_s(fast, 2)}**",
        )
        headlines.add(
            f"asynclock at {n} tasks: cross-worker handoff p50 / p99 ms; longest streak",
            f"**{_s(p50, 3)}** / {_s(p99, 3)}; {_s(streak, 0)} (redis-py: {_s(theirs, 0)})",
        )
    add("asynclock 3 processes: cycles/s", multi, P_ASYNCLOCK, "cycles_s", 0)
    add("asynclock 3 processes ÷ redis-py 3 processes", multi, P_ASYNCLOCK, "x_p_redispy", 2)
    add("asynclock 3 processes: cross-process handoff p50 ms", multi, P_ASYNCLOCK, "xg_p50", 3)
    headlines.add(
        "mutual-exclusion violations, all variants and rounds",
        fmt(float(violations([*sweep.values(), multi])), 0),
    )
    return Section("contended", "\n".join(body), headlines.rows)


SCENARIO = Scenario("contended", run)
