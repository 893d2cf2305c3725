"""Scenario ``uncontended``: one task, N acquire+release pairs on one key."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import redis
import redis.asyncio

from benchmarks.harness.env import (
    RELEASE_SCRIPT,
    Asynclock,
    CommandCounter,
    Config,
    StateLike,
    now_utc,
    optional,
)
from benchmarks.harness.pairs import RedisFloor, lock_pairs
from benchmarks.harness.report import Column, Headlines, Rounds, Section, kept, table
from benchmarks.harness.rounds import Timed, interleave
from benchmarks.harness.scenario import Scenario, Variant
from benchmarks.harness.stats import fmt

if TYPE_CHECKING:
    from collections.abc import Callable

FLOOR = "floor: redis.asyncio SET NX PX + EVALSHA"
SYNC_FLOOR = "floor: redis.Redis (sync) SET NX PX + EVALSHA"
REDISPY = "redis-py asyncio Lock (r.lock, new object per pair)"
ASYNCLOCK = "**asynclock** AsyncLock (RedisState, new object per pair)"
PRL = "python-redis-lock (sync, own loop)"
POTTERY = "pottery Redlock (sync, 1 master, one object reused, own loop)"
WARMUP = 50


class SyncFloor(Variant):
    name = SYNC_FLOOR

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.key = cfg.key("uncontended", "sync-floor")
        self.client = redis.Redis.from_url(cfg.url)
        self.sha = ""

    async def setup(self) -> None:
        self.sha = str(self.client.script_load(RELEASE_SCRIPT))

    async def loop(self, n: int) -> None:  # blocks the loop on purpose: nothing else runs
        set_ = cast("Callable[..., Any]", self.client.set)
        evalsha = cast("Callable[..., Any]", self.client.evalsha)
        key, sha, misses = self.key, self.sha, 0
        for i in range(n):
            token = f"t{i}"
            if not set_(key, token, nx=True, px=30000):
                misses += 1
            if not evalsha(sha, 1, key, token):
                misses += 1
        self.passed(misses)

    async def teardown(self) -> None:
        self.client.close()


class RedisPyLock(Variant):
    name = REDISPY

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.key = cfg.key("uncontended", "redis-py")
        self.client = redis.asyncio.Redis.from_url(cfg.url)

    async def loop(self, n: int) -> None:
        client, key, misses = self.client, self.key, 0
        for _ in range(n):
            lock = client.lock(key, timeout=30)
            if not await lock.acquire():
                misses += 1
            await lock.release()
        self.passed(misses)

    async def teardown(self) -> None:
        await self.client.aclose()


class AsynclockRedis(Variant):
    name = ASYNCLOCK

    def __init__(self, cfg: Config, api: Asynclock) -> None:
        super().__init__()
        self.key = cfg.key("uncontended", "asynclock")
        self.state: StateLike = api.redis_state(cfg.url, cfg.prefix)
        self.lock_cls = api.lock_factory()

    async def loop(self, n: int) -> None:
        self.passed(await lock_pairs(self.lock_cls, self.state, self.key, n))

    async def teardown(self) -> None:
        await self.state.aclose()


class PythonRedisLock(Variant):
    name = PRL

    def __init__(self, cfg: Config, module: Any) -> None:
        super().__init__()
        self.key = cfg.key("uncontended", "python-redis-lock")
        self.client = redis.Redis.from_url(cfg.url)
        self.lock_cls = module.Lock

    async def loop(self, n: int) -> None:  # sync library: its own blocking loop
        lock_cls, client, key, misses = self.lock_cls, self.client, self.key, 0
        for _ in range(n):
            lock = lock_cls(client, key, expire=30)
            if not lock.acquire():
                misses += 1
            lock.release()
        self.passed(misses)

    async def teardown(self) -> None:
        self.client.close()


class PotteryRedlock(Variant):
    """pottery's documented usage: one ``Redlock`` per resource, reused for every acquire.

    pottery is sync and, even with one master, runs each acquire and release through a new
    ``ThreadPoolExecutor``; that is part of what is measured.
    """

    name = POTTERY

    def __init__(self, cfg: Config, module: Any) -> None:
        super().__init__()
        self.client = redis.Redis.from_url(cfg.url)
        key = cfg.key("uncontended", "pottery")
        self.lock = module.Redlock(key=key, masters={self.client}, auto_release_time=30)

    async def loop(self, n: int) -> None:  # sync library: its own blocking loop
        lock, misses = self.lock, 0
        for _ in range(n):
            if not lock.acquire():
                misses += 1
            lock.release()
        self.passed(misses)

    async def teardown(self) -> None:
        self.client.close()


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 1000 if cfg.quick else 5000
    rounds_n = cfg.rounds_or(7, 3)
    rounds = Rounds()
    floor = RedisFloor(FLOOR, cfg.url, cfg.key("uncontended", "floor"))
    variants: list[Variant] = [floor, SyncFloor(cfg), RedisPyLock(cfg)]
    for name in (FLOOR, SYNC_FLOOR, REDISPY, ASYNCLOCK, PRL, POTTERY):
        rounds.declare(name)
    peers = (
        (ASYNCLOCK, AsynclockRedis, api),
        (PRL, PythonRedisLock, optional("redis_lock", "python-redis-lock")),
        (POTTERY, PotteryRedlock, optional("pottery", "pottery")),
    )
    for name, row, module in peers:
        if isinstance(module, str):
            rounds.skip(name, module)
        else:
            variants.append(row(cfg, module))

    refs = {"redispy": REDISPY, "floor": FLOOR, "sync_floor": SYNC_FLOOR, "prl": PRL}
    for variant in variants:
        variant.refs = {**refs, "pottery": POTTERY}
    started = now_utc()
    monitor = redis.asyncio.Redis.from_url(cfg.url)
    try:
        await interleave(
            variants,
            rounds,
            n=n,
            rounds_n=rounds_n,
            scenario="uncontended",
            warmup=WARMUP,
            names=Timed("pairs_s", "us_pair", "cpu_us_pair", "cmds_pair", time_ratios=True),
            counter=CommandCounter(monitor),
        )
    finally:
        await monitor.aclose()
    return _section(cfg, rounds, n, rounds_n, started)


def _section(cfg: Config, rounds: Rounds, n: int, rounds_n: int, started: str) -> Section:
    columns = [
        Column("acquire+release pairs/s", "pairs_s"),
        Column("µs per pair", "us_pair"),
        Column("client CPU µs per pair", "cpu_us_pair"),
        Column("÷ redis-py Lock (throughput)", "x_redispy", 2),
        Column("÷ async floor (throughput)", "x_floor", 2),
        Column("time x async floor", "t_floor", 2),
        Column("÷ sync floor (throughput)", "x_sync_floor", 2),
        Column("Redis commands per pair", "cmds_pair", 2),
    ]
    body = [
        "## Uncontended: 1 task, one key",
        "",
        (
            f"{n:,} acquire+release pairs per variant and round, {rounds_n} rounds, variants interleaved "
            f"round-robin (the starting variant rotates). Cells: median (min-max) over the rounds; "
            f"ratios are taken within each round, then summarised. Started {started} against "
            f"`{cfg.url}`."
        ),
        "",
        table(rounds, columns),
        "",
        kept("uncontended-rows"),
    ]
    headlines = Headlines()
    mine = f" (asynclock {fmt(rounds.spread(ASYNCLOCK, 'pairs_s').median, 0)} pairs/s)"
    for label, metric in (
        ("asynclock ÷ redis-py Lock, uncontended throughput", "x_redispy"),
        ("asynclock ÷ redis.asyncio raw floor, uncontended throughput", "x_floor"),
        ("asynclock ÷ python-redis-lock (sync), uncontended throughput", "x_prl"),
        ("asynclock ÷ pottery Redlock (sync, 1 master), uncontended throughput", "x_pottery"),
    ):
        missing = "n/a (skipped: see the table)"
        headlines.metric(label, rounds, ASYNCLOCK, metric, 2, note=mine, missing=missing)
    theirs = f" (pottery {fmt(rounds.spread(POTTERY, 'pairs_s').median, 0)} pairs/s)"
    for label, metric in (
        ("pottery Redlock ÷ redis-py Lock, uncontended throughput", "x_redispy"),
        ("pottery Redlock ÷ sync floor (redis.Redis), uncontended throughput", "x_sync_floor"),
    ):
        if rounds.spread(POTTERY, metric).count:
            headlines.metric(label, rounds, POTTERY, metric, 2, bold=False, note=theirs)
    return Section("uncontended", "\n".join(body), headlines.rows)


SCENARIO = Scenario("uncontended", run)
