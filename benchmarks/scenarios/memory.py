"""Scenario ``memory``: MemoryState AsyncLock against asyncio.Lock and anyio.Lock, in one process.

``anyio.Lock`` is the anchor with checkpoint semantics: its ``acquire`` checkpoints (yields to
the loop, cancellable) even on a free lock, as every asynclock operation does; its ``release``
is a plain method. The second anyio row adds ``anyio.lowlevel.checkpoint()`` after the release,
so that it makes the two checkpoints per pair asynclock's yield rule makes.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import anyio
import anyio.lowlevel

from benchmarks.harness.contend import Contender, analyze, columns, contend
from benchmarks.harness.contenders import AsyncioLockContender, AsynclockContender
from benchmarks.harness.env import Asynclock, Config, StateLike, log, now_utc
from benchmarks.harness.pairs import lock_pairs
from benchmarks.harness.report import Column, Headlines, Rounds, Section, kept, table
from benchmarks.harness.rounds import rotated
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.stats import fmt_spread

IDEAL = "asyncio.Lock (acquire + release)"
IDEAL_CM = "asyncio.Lock (`async with`)"
ANYIO = "anyio.Lock (acquire checkpoints, release does not)"
ANYIO_2 = "anyio.Lock + `checkpoint()` after release (two checkpoints, as asynclock)"
MEMORY = "**asynclock** AsyncLock (MemoryState, new object per pair)"
MEMORY_CM = "**asynclock** `async with AsyncLock(...)` (MemoryState)"
C_IDEAL = "asyncio.Lock, 16 tasks x 100 cycles"
C_MEMORY = "**asynclock** MemoryState, 16 tasks x 100 cycles"
S_AS_SHIPPED = "**asynclock** AsyncLock acquire + release (MemoryState), as shipped"
S_NO_YIELD = "the same, `asyncio.sleep(0)` patched to return without yielding (measurement only)"
S_YIELD = "`await asyncio.sleep(0)` alone: one pass of the event loop, nothing else ready"
S_IDEAL = "asyncio.Lock acquire + release (never yields on a free lock)"
S_STATE = "`state.acquire` + `state.release` directly (no AsyncLock), without yielding"


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


async def _anyio(n: int) -> None:
    lock = anyio.Lock()
    for _ in range(n):
        await lock.acquire()
        lock.release()


async def _anyio_two_checkpoints(n: int) -> None:
    lock = anyio.Lock()
    checkpoint = anyio.lowlevel.checkpoint
    for _ in range(n):
        await lock.acquire()
        lock.release()
        await checkpoint()


def _memory(api: Asynclock, state: StateLike, key: str) -> Any:
    lock_cls = api.lock_factory()

    async def loop(n: int) -> None:
        misses = await lock_pairs(lock_cls, state, key, n)
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


async def _yields(n: int) -> None:
    sleep = asyncio.sleep
    for _ in range(n):
        await sleep(0)


def _state_pairs(state: Any, key: str) -> Any:
    async def loop(n: int) -> None:
        for _ in range(n):
            await state.acquire(key, "owner", 30.0)
            await state.release(key, "owner")

    return loop


async def _split_round(loop: Any, state_loop: Any, n: int) -> dict[str, dict[str, float]]:
    """Where an uncontended MemoryState pair's time goes: the yields against everything else.

    Every asynclock operation yields to the event loop once by design (STYLE.md 9.7, the trio
    checkpoint rule), so a pair is at least two loop passes. Here the pair is timed as shipped,
    then with ``asyncio.sleep`` replaced by a coroutine that returns at once (only inside this
    measurement, with nothing else running on the loop), and the yields are counted with a
    wrapper around the real ``asyncio.sleep``.
    """
    real_sleep = asyncio.sleep
    calls = [0]

    async def counting(delay: float, result: Any = None) -> Any:
        calls[0] += 1
        return await real_sleep(delay, result)

    async def no_yield(delay: float, result: Any = None) -> Any:
        if delay:
            return await real_sleep(delay, result)
        return result

    out: dict[str, dict[str, float]] = {}
    timed: list[tuple[str, Any, Any]] = [(S_IDEAL, _ideal, None), (S_YIELD, _yields, None)]
    timed += [(S_AS_SHIPPED, loop, None), (S_NO_YIELD, loop, no_yield)]
    timed.append((S_STATE, state_loop, no_yield))
    for name, body, patch in timed:
        gc.collect()
        if patch is not None:
            asyncio.sleep = patch
        try:
            t0 = time.perf_counter()
            await body(n)
            wall = time.perf_counter() - t0
        finally:
            asyncio.sleep = real_sleep
        out[name] = {"us": wall / n * 1e6}
    wrapper: Any = counting
    asyncio.sleep = wrapper
    try:
        await loop(1000)
    finally:
        asyncio.sleep = real_sleep
    out[S_AS_SHIPPED]["yields"] = calls[0] / 1000
    out[S_NO_YIELD]["yields"] = 0.0
    out[S_YIELD]["yields"] = 1.0
    out[S_IDEAL]["yields"] = 0.0
    out[S_STATE]["yields"] = 0.0
    for metrics in out.values():
        metrics["x_ideal"] = metrics["us"] / out[S_IDEAL]["us"]
    shipped, bare = out[S_AS_SHIPPED]["us"], out[S_NO_YIELD]["us"]
    out[S_AS_SHIPPED]["share_yields"] = (shipped - bare) / shipped * 100
    out[S_AS_SHIPPED]["yield_us"] = shipped - bare
    return out


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 20000 if cfg.quick else 50000
    rounds_n = cfg.rounds_or(5, 3)
    solo, crowd = Rounds(), Rounds()
    for name in (IDEAL, IDEAL_CM, ANYIO, ANYIO_2, MEMORY, MEMORY_CM):
        solo.declare(name)
    for name in (C_IDEAL, C_MEMORY):
        crowd.declare(name)
    anchors: dict[str, Any] = {
        IDEAL: _ideal,
        IDEAL_CM: _ideal_cm,
        ANYIO: _anyio,
        ANYIO_2: _anyio_two_checkpoints,
    }
    loops: dict[str, Any] = dict(anchors)
    contenders: dict[str, Contender] = {C_IDEAL: AsyncioLockContender()}
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
            contenders[C_MEMORY] = AsynclockContender(
                api.lock_factory(), state, cfg.key("memory", "contended")
            )
            for name in (MEMORY, MEMORY_CM):
                await loops[name](100)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            for name in (MEMORY, MEMORY_CM, C_MEMORY):
                solo.skip(name, f"{type(exc).__name__}: {exc}")
                crowd.skip(name, f"{type(exc).__name__}: {exc}")
            loops = dict(anchors)
            contenders = {C_IDEAL: AsyncioLockContender()}
            log(f"memory: asynclock skipped: {exc!r}")

    started = now_utc()
    names = list(loops)
    for r in range(rounds_n):
        per_round: dict[str, dict[str, float]] = {}
        for name in rotated(names, r):
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
            if ANYIO in per_round:
                metrics["t_anyio"] = metrics["us_pair"] / per_round[ANYIO]["us_pair"]
            if ANYIO_2 in per_round:
                metrics["t_anyio2"] = metrics["us_pair"] / per_round[ANYIO_2]["us_pair"]
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
    split = Rounds()
    for name in (S_IDEAL, S_YIELD, S_AS_SHIPPED, S_NO_YIELD, S_STATE):
        split.declare(name)
    split_n = 5000 if cfg.quick else 20000
    if MEMORY in loops:
        try:
            for _ in range(rounds_n):
                state_loop = _state_pairs(state, cfg.key("memory", "state"))
                measured = await _split_round(loops[MEMORY], state_loop, split_n)
                for name, metrics in measured.items():
                    split.add(name, metrics)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            split.skip(S_AS_SHIPPED, f"{type(exc).__name__}: {exc}")
            log(f"memory: yield split failed: {exc!r}")
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
        Column("cost x anyio.Lock", "t_anyio", 2),
        Column("cost x anyio.Lock + checkpoint", "t_anyio2", 2),
    ]
    crowd_cols = columns(
        "cycles_s",
        Column("÷ asyncio.Lock", "x_ideal", 3),
        "xh_p50",
        "xh_p99",
        Column("acquire wait max ms", "w_max", 2),
        "streak",
        Column("min acquisitions per worker", "fair_min"),
        Column("violations", "violations"),
        Column("overlaps", "overlaps"),
    )
    body = "\n".join(
        [
            "## Memory: MemoryState against asyncio.Lock and anyio.Lock",
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
            "",
            "### Where the uncontended pair's time goes",
            "",
            f"{split_n:,} pairs per row and round, {rounds_n} rounds.",
            "",
            kept("memory-split"),
            "",
            table(
                split,
                [
                    Column("µs per pair (or per yield)", "us", 2),
                    Column("x asyncio.Lock", "x_ideal", 1),
                    Column("event-loop yields per pair", "yields", 1, median_only=True),
                    Column("yields' share of the pair %", "share_yields", 0),
                ],
            ),
        ]
    )
    headlines = Headlines()
    if solo.spread(MEMORY, "t_ideal").count:
        what = "MemoryState AsyncLock cost ÷ {}, uncontended pair"
        headlines.metric(what.format("asyncio.Lock"), solo, MEMORY, "t_ideal", 1, bold=False)
        for metric, anchor in (("t_anyio", "anyio.Lock"), ("t_anyio2", "anyio.Lock + checkpoint")):
            headlines.metric(what.format(anchor), solo, MEMORY, metric, 2, bold=False)
        what = "MemoryState AsyncLock µs per acquire+release"
        headlines.metric(what, solo, MEMORY, "us_pair", 2, bold=False)
    else:
        headlines.add("MemoryState AsyncLock cost ÷ asyncio.Lock", "n/a (skipped: see the table)")
    shipped, bare = split.spread(S_AS_SHIPPED, "us"), split.spread(S_NO_YIELD, "us")
    if shipped.count and bare.count:
        headlines.add(
            "MemoryState pair µs: as shipped / without its yields / asyncio.Lock",
            " / ".join(fmt_spread(s, 2) for s in (shipped, bare, split.spread(S_IDEAL, "us"))),
        )
    if crowd.spread(C_MEMORY, "x_ideal").count:
        what = "MemoryState contended throughput ÷ asyncio.Lock (16x100)"
        headlines.metric(what, crowd, C_MEMORY, "x_ideal", 3, bold=False)
    return Section("memory", body, headlines.rows)


SCENARIO = Scenario("memory", run, redis=False)
