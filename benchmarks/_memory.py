"""Scenario ``memory``: MemoryState AsyncLock against asyncio.Lock, in one process."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from benchmarks._contend import Contender, analyze, contend
from benchmarks._env import Asynclock, Config, StateLike, log, now_utc
from benchmarks._report import Column, Rounds, Section, table
from benchmarks._stats import fmt_spread

IDEAL = "asyncio.Lock (acquire + release)"
IDEAL_CM = "asyncio.Lock (`async with`)"
MEMORY = "**asynclock** AsyncLock (MemoryState, new object per pair)"
MEMORY_CM = "**asynclock** `async with AsyncLock(...)` (MemoryState)"
C_IDEAL = "asyncio.Lock, 16 tasks x 100 cycles"
C_MEMORY = "**asynclock** MemoryState, 16 tasks x 100 cycles"


async def _ideal(n: int) -> None:
    lock = asyncio.Lock()
    for _ in range(n):
        await lock.acquire()
        lock.release()


async def _ideal_cm(n: int) -> None:
    lock = asyncio.Lock()
    for _ in range(n):
        async with lock:
            pass


def _memory(api: Asynclock, state: StateLike, key: str) -> Any:
    lock_cls = api.lock_factory()

    async def loop(n: int) -> None:
        misses = 0
        for _ in range(n):
            lock = lock_cls(state, key, ttl=30.0)
            if not await lock.acquire():
                misses += 1
            await lock.release()
        if misses:
            raise RuntimeError(f"{misses} failed acquires")

    return loop


def _memory_cm(api: Asynclock, state: StateLike, key: str) -> Any:
    lock_cls = api.lock_factory()

    async def loop(n: int) -> None:
        for _ in range(n):
            async with lock_cls(state, key, ttl=30.0):
                pass

    return loop


class _IdealContender:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    async def acquire(self) -> Any:
        await self.lock.acquire()

    async def release(self, handle: Any) -> None:
        self.lock.release()


class _MemoryContender:
    def __init__(self, api: Asynclock, state: StateLike, key: str) -> None:
        self.lock_cls, self.state, self.key = api.lock_factory(), state, key

    async def acquire(self) -> Any:
        lock = self.lock_cls(self.state, self.key, ttl=30.0)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 20000 if cfg.quick else 50000
    rounds_n = cfg.rounds_or(5, 3)
    solo, crowd = Rounds(), Rounds()
    for name in (IDEAL, IDEAL_CM, MEMORY, MEMORY_CM):
        solo.declare(name)
    for name in (C_IDEAL, C_MEMORY):
        crowd.declare(name)
    loops: dict[str, Any] = {IDEAL: _ideal, IDEAL_CM: _ideal_cm}
    contenders: dict[str, Contender] = {C_IDEAL: _IdealContender()}
    state: StateLike | None = None
    if isinstance(api, str):
        for name in (MEMORY, MEMORY_CM):
            solo.skip(name, api)
        crowd.skip(C_MEMORY, api)
    else:
        try:
            state = api.memory_state()
            key = cfg.key("memory")
            loops[MEMORY] = _memory(api, state, key)
            loops[MEMORY_CM] = _memory_cm(api, state, key)
            contenders[C_MEMORY] = _MemoryContender(api, state, cfg.key("memory", "contended"))
            for name in (MEMORY, MEMORY_CM):
                await loops[name](100)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            for name in (MEMORY, MEMORY_CM, C_MEMORY):
                solo.skip(name, f"{type(exc).__name__}: {exc}")
                crowd.skip(name, f"{type(exc).__name__}: {exc}")
            loops = {IDEAL: _ideal, IDEAL_CM: _ideal_cm}
            contenders = {C_IDEAL: _IdealContender()}
            log(f"memory: asynclock skipped: {exc!r}")

    started = now_utc()
    names = list(loops)
    for r in range(rounds_n):
        per_round: dict[str, dict[str, float]] = {}
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                await loops[name](n)
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                solo.skip(name, f"{type(exc).__name__}: {exc}")
                continue
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            per_round[name] = {
                "pairs_s": n / wall,
                "us_pair": wall / n * 1e6,
                "cpu_us_pair": cpu / n * 1e6,
            }
        for metrics in per_round.values():
            if IDEAL in per_round:
                metrics["t_ideal"] = metrics["us_pair"] / per_round[IDEAL]["us_pair"]
        for name, metrics in per_round.items():
            solo.add(name, metrics)
        crowd_round: dict[str, dict[str, float]] = {}
        for name, contender in contenders.items():
            gc.collect()
            outcome = await contend(contender, workers=16, cycles=100, timeout=60)
            if outcome.timed_out:
                crowd.skip(name, "timed out after 60 s")
                continue
            crowd_round[name] = analyze(
                outcome.events,
                workers=16,
                started=outcome.started,
                counter_violations=outcome.counter_violations,
            )
        for metrics in crowd_round.values():
            if C_IDEAL in crowd_round:
                metrics["x_ideal"] = metrics["cycles_s"] / crowd_round[C_IDEAL]["cycles_s"]
        for name, metrics in crowd_round.items():
            crowd.add(name, metrics)
        log(f"memory round {r + 1}/{rounds_n} done")
    if state is not None:
        try:
            await state.aclose()
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            log(f"memory: aclose failed: {exc!r}")

    cols = [
        Column("pairs/s", "pairs_s"),
        Column("µs per pair", "us_pair", 2),
        Column("CPU µs per pair", "cpu_us_pair", 2),
        Column("cost x asyncio.Lock", "t_ideal", 1),
    ]
    crowd_cols = [
        Column("cycles/s", "cycles_s"),
        Column("÷ asyncio.Lock", "x_ideal", 3),
        Column("cross-worker handoff p50 ms", "xh_p50", 3),
        Column("cross-worker handoff p99 ms", "xh_p99", 3),
        Column("acquire wait max ms", "w_max", 2),
        Column("longest same-worker streak", "streak"),
        Column("min acquisitions per worker", "fair_min"),
        Column("violations", "violations"),
        Column("overlaps", "overlaps"),
    ]
    body = "\n".join(
        [
            "## Memory: MemoryState against asyncio.Lock",
            "",
            (
                f"Uncontended: one task, {n:,} pairs per variant and round, {rounds_n} rounds, "
                f"interleaved. Contended: 16 tasks x 100 cycles, same workload as the `contended` "
                f"scenario. Started {started}."
            ),
            "",
            table(solo, cols),
            "",
            table(crowd, crowd_cols),
        ]
    )
    headlines: list[tuple[str, str]] = []
    spread = solo.spread(MEMORY, "t_ideal")
    if spread.count:
        headlines.append(
            ("MemoryState AsyncLock cost ÷ asyncio.Lock, uncontended pair", fmt_spread(spread, 1))
        )
        us = solo.spread(MEMORY, "us_pair")
        headlines.append(("MemoryState AsyncLock µs per acquire+release", fmt_spread(us, 2)))
    else:
        headlines.append(
            ("MemoryState AsyncLock cost ÷ asyncio.Lock", "n/a (skipped: see the table)")
        )
    spread = crowd.spread(C_MEMORY, "x_ideal")
    if spread.count:
        headlines.append(
            ("MemoryState contended throughput ÷ asyncio.Lock (16x100)", fmt_spread(spread, 3))
        )
    return Section("memory", body, headlines)
