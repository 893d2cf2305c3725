"""Scenario ``semaphore``: asynclock's Semaphore beside the asyncio Redis semaphores of PyPI.

Uncontended pairs and 16 tasks at ``limit=3``, variants interleaved round-robin; what each
variant runs (py-redis-semaphore, redis-limiters, a raw EVALSHA floor that polls when
contended, so a reference rather than a floor there): docs/benchmarks.md, ``semaphore``.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import math
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness.contend import contend as harness_contend
from benchmarks.harness.env import Asynclock, CommandCounter, Config, log, now_utc, short
from benchmarks.harness.report import Column, Headlines, Rounds, Section, kept, table
from benchmarks.harness.rounds import rotated
from benchmarks.harness.scenario import Scenario, Variant
from benchmarks.harness.stats import percentile

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

LIMIT = 3
TASKS = 16
ASYNCLOCK = "**asynclock** Semaphore (RedisState)"
PY_REDIS_SEMAPHORE = "py-redis-semaphore (BLPOP wake-ups)"
REDIS_LIMITERS = "redis-limiters AsyncSemaphore (BLPOP tokens)"
FLOOR = "floor: EVALSHA take + EVALSHA give back"
PEERS = ((PY_REDIS_SEMAPHORE, "prs"), (REDIS_LIMITERS, "rl"), (FLOOR, "floor"))

#: take a slot: drop expired holders, add ours if fewer than ARGV[1] (server clock)
TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
  return 1
end
return 0
"""
GIVE = "return redis.call('ZREM', KEYS[1], ARGV[1])"


class Permits(Variant):
    """A row of this scenario: a semaphore's blocking take and its give-back."""

    async def acquire(self) -> Any:
        """Take a permit, waiting for one; a handle for :meth:`release`."""
        raise NotImplementedError

    async def release(self, handle: Any) -> None:
        """Give the permit of ``handle`` back."""
        raise NotImplementedError


class AsynclockVariant(Permits):
    name = ASYNCLOCK

    def __init__(self, api: Asynclock, state: Any, key: str) -> None:
        super().__init__()
        self.cls, self.state, self.key = api.module.Semaphore, state, key

    async def acquire(self) -> Any:
        permit = self.cls(self.state, self.key, limit=LIMIT, ttl=30.0)
        await permit.acquire()
        return permit

    async def release(self, handle: Any) -> None:
        await handle.release()


class PyRedisSemaphoreVariant(Permits):
    name = PY_REDIS_SEMAPHORE

    def __init__(self, module: Any, client: redis.asyncio.Redis, key: str) -> None:
        super().__init__()
        self.module, self.client, self.key = module, client, key

    async def acquire(self) -> Any:
        config = self.module.SemaphoreConfig(name=self.key, limit=LIMIT, lock_timeout=30.0)
        semaphore = self.module.Semaphore(self.client, config)
        result = await semaphore.aacquire()
        if not result.success:
            raise RuntimeError("py-redis-semaphore: a blocking acquire failed")
        return semaphore

    async def release(self, handle: Any) -> None:
        await handle.arelease()


class RedisLimitersVariant(Permits):
    name = REDIS_LIMITERS

    def __init__(self, module: Any, client: redis.asyncio.Redis, key: str) -> None:
        super().__init__()
        self.module, self.client, self.key = module, client, key

    async def acquire(self) -> Any:
        semaphore = self.module.AsyncSemaphore(
            name=self.key, capacity=LIMIT, expiry=30, max_sleep=0, connection=self.client
        )
        await semaphore.__aenter__()
        return semaphore

    async def release(self, handle: Any) -> None:
        await handle.__aexit__(None, None, None)


class FloorVariant(Permits):
    name = FLOOR

    def __init__(self, client: redis.asyncio.Redis, key: str) -> None:
        super().__init__()
        self.client, self.key = client, key
        self.take = client.register_script(TAKE)
        self.give = client.register_script(GIVE)

    async def acquire(self) -> Any:
        owner = uuid.uuid4().hex
        # the polling reference, on purpose: a refused take retries after a millisecond
        while not await self.take(keys=[self.key], args=[LIMIT, 30000, owner]):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        return owner

    async def release(self, handle: Any) -> None:
        await self.give(keys=[self.key], args=[handle])


# -- the workloads -------------------------------------------------------------------------------


async def pairs(variant: Permits, n: int) -> None:
    for _ in range(n):
        await variant.release(await variant.acquire())


async def contend(variant: Permits, cycles: int, timeout: float) -> dict[str, float]:
    """``TASKS`` tasks x ``cycles`` acquire / one yield inside / release; the metrics."""
    run = await harness_contend(variant, workers=TASKS, cycles=cycles, timeout=timeout, limit=LIMIT)
    if run.timed_out:
        raise TimeoutError(f"{variant.name}: not done within {timeout:.0f} s")
    events = [(wid, called, acquired, left) for wid, _, called, acquired, left, _ in run.events]
    return analyze(events, run.started, run.most_inside)


def analyze(
    events: list[tuple[int, float, float, float]], started: float, most: int
) -> dict[str, float]:
    ordered = sorted(events, key=lambda e: e[2])
    wall = max(e[3] for e in ordered) - started
    leaves = sorted(e[3] for e in ordered)
    # handoff: an acquire that was waiting when a permit was given back, measured from the
    # latest give-back before it returned (that release is what let it in)
    handoffs = []
    for _, called, acquired, _ in ordered:
        at = bisect.bisect_right(leaves, acquired) - 1
        if at >= 0 and called < leaves[at]:
            handoffs.append((acquired - leaves[at]) * 1e3)
    streak = longest = 0
    previous = None
    for wid, *_ in ordered:
        streak = streak + 1 if wid == previous else 1
        longest = max(longest, streak)
        previous = wid
    first_done = min(max(e[3] for e in ordered if e[0] == w) for w in {e[0] for e in ordered})
    window = Counter(e[0] for e in ordered if e[2] <= first_done)
    counts = [window.get(w, 0) for w in range(TASKS)]
    return {
        "cycles_s": len(ordered) / wall,
        "h_p50": percentile(handoffs, 50),
        "h_p99": percentile(handoffs, 99),
        "streak": float(longest),
        "fair_min": float(min(counts)),
        "fair_max": float(max(counts)),
        "most_inside": float(most),
        "violations": float(most > LIMIT),
    }


# -- the scenario --------------------------------------------------------------------------------


def _peers(cfg: Config, client: redis.asyncio.Redis, tag: str) -> tuple[list[Permits], list[str]]:
    """The peer variants on keys of ``tag``, and why any is missing."""
    variants: list[Permits] = [FloorVariant(client, cfg.key("semaphore", tag, "floor"))]
    missing = []
    try:
        import redis_semaphore
    except ImportError as exc:
        missing.append(f"{PY_REDIS_SEMAPHORE}: not installed ({exc})")
    else:
        key = cfg.key("semaphore", tag, "prs")
        variants.append(PyRedisSemaphoreVariant(redis_semaphore, client, key))
    try:
        import redis_limiters
    except ImportError as exc:
        missing.append(f"{REDIS_LIMITERS}: not installed ({exc})")
    else:
        key = cfg.key("semaphore", tag, "rl")
        variants.append(RedisLimitersVariant(redis_limiters, client, key))
    return variants, missing


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 500 if cfg.quick else 2000
    cycles = 20 if cfg.quick else 60
    rounds_n = cfg.rounds_or(5, 2)
    timeout = 120.0
    client = redis.asyncio.Redis.from_url(cfg.url, max_connections=4 * TASKS)
    counter = CommandCounter(redis.asyncio.Redis.from_url(cfg.url))
    closers: list[Callable[[], Awaitable[None]]] = [client.aclose, counter.client.aclose]
    uncontended, contended = Rounds(), Rounds()
    for name in (ASYNCLOCK, PY_REDIS_SEMAPHORE, REDIS_LIMITERS, FLOOR):
        uncontended.declare(name)
        contended.declare(name)
    single, missing = _peers(cfg, client, "pairs")
    many, _ = _peers(cfg, client, "contended")
    for text in missing:
        name, reason = text.split(": ", 1)
        uncontended.skip(name, reason)
        contended.skip(name, reason)
    if isinstance(api, str):
        uncontended.skip(ASYNCLOCK, api)
        contended.skip(ASYNCLOCK, api)
    else:
        state: Any = api.redis_state(cfg.url, cfg.prefix)
        closers.append(state.aclose)
        single.append(AsynclockVariant(api, state, cfg.key("semaphore", "pairs", "asynclock")))
        many.append(AsynclockVariant(api, state, cfg.key("semaphore", "contended", "asynclock")))
    started = now_utc()
    try:
        for variant in single:
            await pairs(variant, 50)  # warm: connections, scripts
        for variant in many:
            await contend(variant, 2, timeout)
        for r in range(rounds_n):
            per_round: dict[str, dict[str, float]] = {}
            for variant in rotated(single, r):
                gc.collect()
                await counter.start()
                t0 = time.perf_counter()
                await pairs(variant, n)
                wall = time.perf_counter() - t0
                per_round[variant.name] = {
                    "pairs_s": n / wall,
                    "us_pair": wall / n * 1e6,
                    "cmds_pair": await counter.stop() / n,
                }
            _ratios(per_round, "pairs_s")
            for name, metrics in per_round.items():
                uncontended.add(name, metrics)
            busy: dict[str, dict[str, float]] = {}
            for variant in rotated(many, r):
                gc.collect()
                await counter.start()
                metrics = await contend(variant, cycles, timeout)
                metrics["cmds_cycle"] = await counter.stop() / (TASKS * cycles)
                busy[variant.name] = metrics
            _ratios(busy, "cycles_s")
            for name, metrics in busy.items():
                contended.add(name, metrics)
            summary = ", ".join(f"{short(k)}: {m['cycles_s']:,.0f}/s" for k, m in busy.items())
            log(f"semaphore round {r + 1}/{rounds_n}: contended {summary}")
    finally:
        for close in closers:
            await close()
    return _section(cfg, uncontended, contended, n, cycles, rounds_n, started)


def _ratios(per_round: dict[str, dict[str, float]], metric: str) -> None:
    """asynclock's ``metric`` divided by each peer's, within one round."""
    mine = per_round.get(ASYNCLOCK)
    if mine is None:
        return
    for peer, tag in PEERS:
        theirs = per_round.get(peer)
        if theirs is not None and theirs[metric] > 0:
            mine[f"x_{tag}"] = mine[metric] / theirs[metric]


def _section(
    cfg: Config,
    uncontended: Rounds,
    contended: Rounds,
    n: int,
    cycles: int,
    rounds_n: int,
    started: str,
) -> Section:
    pair_columns = [
        Column("acquire+release pairs/s", "pairs_s"),
        Column("µs per pair", "us_pair"),
        Column("Redis commands per pair", "cmds_pair", 2),
        Column("asynclock ÷ this (throughput)", "x_self", 2),
    ]
    busy_columns = [
        Column("cycles/s", "cycles_s"),
        Column("handoff p50 ms", "h_p50", 3),
        Column("handoff p99 ms", "h_p99", 3),
        Column("longest same-task streak", "streak"),
        Column("min per task*", "fair_min"),
        Column("max per task*", "fair_max"),
        Column("most holders at once", "most_inside"),
        Column("Redis commands per cycle", "cmds_cycle", 2),
        Column("asynclock ÷ this (throughput)", "x_self", 2),
    ]
    for rounds in (uncontended, contended):
        _self_ratios(rounds)
    body = [
        f"## Semaphore: limit {LIMIT}, against the asyncio Redis semaphores of PyPI",
        "",
        (
            f"{rounds_n} rounds, variants interleaved round-robin (the starting variant rotates), "
            f"one process, one client per variant family, against `{cfg.url}`; started "
            f"{started}. Cells: median (min-max) over the rounds; ratios are taken within each "
            "round."
        ),
        "",
        f"### Uncontended: one task, {n:,} acquire+release pairs",
        "",
        table(uncontended, pair_columns),
        "",
        f"### Contended: {TASKS} tasks x {cycles} cycles on one key, limit {LIMIT}",
        "",
        table(contended, busy_columns),
        "",
        (
            "\\* acquisitions per task while every task still competed (up to the first task's "
            f"last release; {cycles} each in all): oldest-first service gives about the same "
            "count to every task."
        ),
        "",
        kept("semaphore-rows"),
    ]
    headlines = Headlines()
    for rounds, what in (
        (uncontended, "uncontended pair"),
        (contended, f"contended throughput ({TASKS} tasks, limit {LIMIT})"),
    ):
        for peer, tag in PEERS:
            headlines.metric(
                f"asynclock Semaphore ÷ {short(peer)}, {what}",
                rounds,
                ASYNCLOCK,
                f"x_{tag}",
                2,
                missing="n/a (skipped: see the table)",
            )
    headlines.metric("asynclock Semaphore handoff p50 ms", contended, ASYNCLOCK, "h_p50", 3)
    headlines.metric(
        "asynclock Semaphore longest same-task streak", contended, ASYNCLOCK, "streak", 0
    )
    return Section("semaphore", "\n".join(body), headlines.rows)


def _self_ratios(rounds: Rounds) -> None:
    """Fill ``x_self`` (asynclock ÷ this variant) from asynclock's ``x_<tag>`` of each round."""
    mine = rounds.data.get(ASYNCLOCK, [])
    for peer, tag in PEERS:
        theirs = rounds.data.get(peer, [])
        for metrics, own in zip(theirs, mine, strict=False):
            value = own.get(f"x_{tag}")
            if value is not None and not math.isnan(value):
                metrics["x_self"] = value
    for own in mine:
        own["x_self"] = 1.0


SCENARIO = Scenario("semaphore", run, own_environment=True)
