"""Scenario ``dedupe``: ``Deduper.first_seen`` checks/s on Memory and Redis against the floor."""

from __future__ import annotations

import gc
import time
from typing import TYPE_CHECKING, Any, cast

import redis.asyncio

from benchmarks.harness import progress as _progress
from benchmarks.harness.env import Asynclock, CommandCounter, Config, StateLike, log, now_utc, short
from benchmarks.harness.report import Column, Headlines, Rounds, Section, kept, table
from benchmarks.harness.rounds import rotated, teardown
from benchmarks.harness.scenario import Scenario, Variant
from benchmarks.harness.stats import fmt

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

PLAIN = "plain Python set (in-process ideal, no yield)"
MEMORY = "**asynclock** Deduper(MemoryState())"
FLOOR = "floor: redis.asyncio SET NX PX, 1 connection"
REDIS = "**asynclock** Deduper(RedisState)"
NEW, DUP = "new ids", "duplicates"
TTL = 60.0


def label(variant: str, phase: str) -> str:
    return f"{variant}, {phase}"


class Checker(Variant):
    """One way of asking "first time?": ``check(id)`` answers True for a new id."""

    def __init__(self, name: str, n: int, redis_side: bool) -> None:
        super().__init__()
        self.name, self.n, self.redis_side = name, n, redis_side
        self.check: Callable[[str], Awaitable[bool]] | None = None
        self.close: Callable[[], Awaitable[None]] | None = None

    async def teardown(self) -> None:
        if self.close is not None:
            await self.close()


def _plain() -> Callable[[str], Awaitable[bool]]:
    seen: set[str] = set()

    async def check(event_id: str) -> bool:
        if event_id in seen:
            return False
        seen.add(event_id)
        return True

    return check


def _floor(cfg: Config) -> tuple[Callable[[str], Awaitable[bool]], Callable[[], Awaitable[None]]]:
    client = redis.asyncio.Redis.from_url(cfg.url)
    set_ = cast("Callable[..., Awaitable[Any]]", client.set)
    prefix = cfg.key("dedupe", "floor") + ":"
    px = int(TTL * 1000)

    async def check(event_id: str) -> bool:
        return bool(await set_(prefix + event_id, b"1", nx=True, px=px))

    return check, client.aclose


async def _timed(
    check: Callable[[str], Awaitable[bool]], ids: list[str], expect: bool
) -> tuple[float, float, int]:
    wrong = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for event_id in ids:
        if await check(event_id) is not expect:
            wrong += 1
    return time.perf_counter() - t0, time.process_time() - c0, wrong


async def run(cfg: Config, api: Asynclock | str) -> Section:
    mem_n = 20_000 if cfg.quick else 50_000
    red_n = 1_000 if cfg.quick else 5_000
    rounds_n = cfg.rounds_or(5, 3)
    rounds = Rounds()
    variants = [
        Checker(PLAIN, mem_n, False),
        Checker(MEMORY, mem_n, False),
        Checker(FLOOR, red_n, True),
        Checker(REDIS, red_n, True),
    ]
    for v in variants:
        for phase in (NEW, DUP):
            rounds.declare(label(v.name, phase))
    variants[0].check = _plain()
    variants[2].check, variants[2].close = _floor(cfg)
    states: list[StateLike] = []
    if isinstance(api, str):
        for v in (variants[1], variants[3]):
            for phase in (NEW, DUP):
                rounds.skip(label(v.name, phase), api)
    else:
        try:
            namespace = f"dedupe-bench-{cfg.run_id}"
            mem_state = api.memory_state()
            red_state = api.redis_state(cfg.url, cfg.prefix)
            states += [mem_state, red_state]
            variants[1].check = api.module.Deduper(
                mem_state, ttl=TTL, namespace=namespace
            ).first_seen
            variants[3].check = api.module.Deduper(
                red_state, ttl=TTL, namespace=namespace
            ).first_seen
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            log(f"dedupe: asynclock skipped: {exc!r}")
            for v in (variants[1], variants[3]):
                for phase in (NEW, DUP):
                    rounds.skip(label(v.name, phase), f"{type(exc).__name__}: {exc}")
    live = [v for v in variants if v.check is not None]
    for v in list(live):  # warm-up: connections, scripts, code paths
        try:
            assert v.check is not None
            for i in range(50):
                await v.check(f"warm-{i}")
        except Exception as exc:  # noqa: BLE001, PERF203 (reported, never fatal)
            live.remove(v)
            for phase in (NEW, DUP):
                rounds.skip(label(v.name, phase), f"{type(exc).__name__}: {exc}")
            log(f"dedupe: {v.name} skipped: {exc!r}")

    monitor = redis.asyncio.Redis.from_url(cfg.url)
    counter = CommandCounter(monitor)
    started = now_utc()
    with _progress.step("dedupe rounds", rounds_n) as bar:
        for r in range(rounds_n):
            per_round: dict[str, dict[str, float]] = {}
            order = rotated(live, r)
            for v in order:
                assert v.check is not None
                ids = [f"r{r}-{i}" for i in range(v.n)]
                for phase, expect in ((NEW, True), (DUP, False)):
                    gc.collect()
                    if v.redis_side:
                        await counter.start()
                    try:
                        wall, cpu, wrong = await _timed(v.check, ids, expect)
                    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                        rounds.skip(label(v.name, phase), f"{type(exc).__name__}: {exc}")
                        log(f"dedupe: {v.name} failed: {exc!r}")
                        break
                    metrics = {
                        "checks_s": v.n / wall,
                        "us_check": wall / v.n * 1e6,
                        "cpu_us_check": cpu / v.n * 1e6,
                        "wrong": float(wrong),
                    }
                    if v.redis_side:
                        metrics["cmds_check"] = await counter.stop() / v.n
                    per_round[label(v.name, phase)] = metrics
            for phase in (NEW, DUP):
                for name, ref, tag in (
                    (REDIS, FLOOR, "x_floor"),
                    (MEMORY, PLAIN, "x_plain"),
                ):
                    mine, theirs = (
                        per_round.get(label(name, phase)),
                        per_round.get(label(ref, phase)),
                    )
                    if mine is not None and theirs is not None:
                        mine[tag] = mine["checks_s"] / theirs["checks_s"]
            for name, metrics in per_round.items():
                rounds.add(name, metrics)
            summary = ", ".join(f"{short(k)}: {m['checks_s']:,.0f}/s" for k, m in per_round.items())
            log(f"dedupe round {r + 1}/{rounds_n}: {summary}")
            bar.advance()
    await monitor.aclose()
    for v in variants:
        await teardown(v, "dedupe")
    try:
        for state in states:
            await state.aclose()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"dedupe: aclose failed: {exc!r}")
    return _section(cfg, rounds, mem_n, red_n, rounds_n, started)


def _section(
    cfg: Config, rounds: Rounds, mem_n: int, red_n: int, rounds_n: int, started: str
) -> Section:
    cols = [
        Column("checks/s", "checks_s"),
        Column("µs per check", "us_check", 2),
        Column("client CPU µs per check", "cpu_us_check", 2),
        Column("÷ floor (throughput)", "x_floor", 2),
        Column("÷ plain set (throughput)", "x_plain", 3),
        Column("Redis commands per check", "cmds_check", 2),
        Column("wrong answers", "wrong"),
    ]
    body = [
        "## Dedupe: Deduper.first_seen checks/s",
        "",
        (
            f"Each round: per variant, {mem_n:,} (in-process) or {red_n:,} (Redis) fresh ids "
            f"checked one after another (*new ids*: every answer must be True), then the same "
            f"ids again (*duplicates*: every answer must be False). {rounds_n} rounds, variants "
            f"interleaved round-robin (the starting variant rotates); ratios are taken within "
            f"each round. TTL {TTL:g} s. Started {started} against `{cfg.url}`."
        ),
        "",
        table(rounds, cols),
        "",
        kept("dedupe-rows"),
    ]
    headlines = Headlines()
    for phase in (NEW, DUP):
        name = label(REDIS, phase)
        speed = rounds.spread(name, "checks_s")
        if speed.count:
            what = f"Deduper on Redis ÷ SET NX PX floor, {phase}"
            note = f" ({fmt(speed.median, 0)} checks/s)"
            headlines.metric(what, rounds, name, "x_floor", 2, note=note)
    for phase in (NEW, DUP):
        name = label(MEMORY, phase)
        if rounds.spread(name, "checks_s").count:
            what = f"Deduper on Memory checks/s, {phase}"
            headlines.metric(what, rounds, name, "checks_s", 0, bold=False)
    return Section("dedupe", "\n".join(body), headlines.rows)


SCENARIO = Scenario("dedupe", run)
