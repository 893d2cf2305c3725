"""Scenario ``inbox``: the durable inbox on Redis (#12).

* **accept throughput**: serial ``EventDispatcher.accept`` calls over 20 keys, against the floor
  of the same server work: the same ``inbox_accept.lua`` sent with ``redis.asyncio``'s own
  ``register_script`` (EVALSHA) on one connection, same keys and arguments.
* **round trips per event**: connection sends counted on the client while accepting, and while
  one ``serve()`` drains what was accepted (subscription and rescans included).
* **accept -> handler start**: one event at a time accepted while a ``serve()`` runs in the same
  process, the time from calling ``accept`` until its handler starts; idle, and with a producer
  accepting to 10 other keys meanwhile.
"""

from __future__ import annotations

import asyncio
import time
from importlib import resources
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks._dispatcher import SendCounter
from benchmarks._env import Config, log
from benchmarks._report import Section, kv_table
from benchmarks._stats import fmt

if TYPE_CHECKING:
    from benchmarks._env import Asynclock

KEYS = 20


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _accepts(api: Any, cfg: Config, n: int, tag: str) -> tuple[float, float]:
    """(accepts per second, sends per accept) of ``n`` serial accepts."""
    state = api.module.RedisState.from_url(cfg.url, prefix=cfg.key("inbox", tag) + ":")
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
    event = api.module.Event
    events = [event("message", "bench", "C", f"T{i % KEYS}", f"{tag}-{i}") for i in range(n)]
    await bot.accept(event("message", "bench", "C", "warm", f"{tag}-warm"))
    sends = SendCounter()
    t0 = time.perf_counter()
    with sends.counting():
        for e in events:
            await bot.accept(e)
    elapsed = time.perf_counter() - t0
    await state.aclose()
    return n / elapsed, sends.sends / n


async def _floor(cfg: Config, n: int, tag: str) -> float:
    """Accepts per second of the raw EVALSHA of the same script on one connection."""
    client = redis.asyncio.Redis.from_url(cfg.url, single_connection_client=True)
    folder = resources.files("asynclock.state.redis")
    text = "\n".join(
        folder.joinpath(name).read_text(encoding="utf-8")
        for name in ("_value.lua", "inbox_accept.lua")
    )
    script = client.register_script(text)
    prefix = cfg.key("inbox-floor", tag)
    t0 = time.perf_counter()
    for i in range(n):
        base = f"{prefix}:{{k{i % KEYS}}}:inbox"
        keys = [base, f"{base}:seq", f"{prefix}:ready", f"{prefix}:wake", f"{base}:claim:{i}"]
        await script(keys=keys, args=[f'{{"n":{i}}}', 10**6, 600_000, f"k{i % KEYS}", "1"])
    elapsed = time.perf_counter() - t0
    await client.aclose()
    return n / elapsed


async def _drain(api: Any, cfg: Config, n: int) -> tuple[float, float]:
    """(events per second, sends per event) for one serve() draining ``n`` accepted events."""
    state = api.module.RedisState.from_url(cfg.url, prefix=cfg.key("inbox", "drain") + ":")
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
    event = api.module.Event
    for i in range(n):
        await bot.accept(event("message", "bench", "C", f"T{i % KEYS}", f"d-{i}"))
    done = asyncio.Event()
    handled = 0

    async def handler(e: Any) -> None:
        nonlocal handled
        handled += 1
        if handled == n:
            done.set()

    bot.add_handler("*", handler)
    sends = SendCounter()
    with sends.counting():
        t0 = time.perf_counter()
        task = asyncio.create_task(bot.serve())
        await asyncio.wait_for(done.wait(), 120)
        elapsed = time.perf_counter() - t0
        await bot.aclose()
        await task
    await state.aclose()
    return n / elapsed, sends.sends / n


async def _latency(api: Any, cfg: Config, n: int, *, loaded: bool) -> list[float]:
    """Seconds from calling accept() until the handler starts, one event at a time."""
    tag = "loaded" if loaded else "idle"
    state = api.module.RedisState.from_url(cfg.url, prefix=cfg.key("inbox", tag) + ":")
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
    event = api.module.Event
    started: dict[str, float] = {}
    arrived = asyncio.Event()

    async def handler(e: Any) -> None:
        if e.thread_id == "probe":
            started[e.message_id] = time.perf_counter()
            arrived.set()

    bot.add_handler("*", handler)
    serving = asyncio.create_task(bot.serve())
    stop = asyncio.Event()

    async def producer() -> None:
        i = 0
        while not stop.is_set():
            await bot.accept(event("message", "bench", "C", f"L{i % 10}", f"load-{i}"))
            i += 1

    load = asyncio.create_task(producer()) if loaded else None
    await asyncio.sleep(0.2)
    samples = []
    for i in range(n):
        arrived.clear()
        t0 = time.perf_counter()
        await bot.accept(event("message", "bench", "C", "probe", f"p-{i}"))
        await asyncio.wait_for(arrived.wait(), 30)
        samples.append(started[f"p-{i}"] - t0)
    stop.set()
    if load is not None:
        await load
    await bot.aclose()
    await serving
    await state.aclose()
    return samples


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("inbox", f"skipped: {api}\n")
    n = 500 if cfg.quick else 2000
    rounds = cfg.rounds_or(5, 3)
    ours: list[float] = []
    floor: list[float] = []
    trips: list[float] = []
    for r in range(rounds):
        log(f"inbox: accept round {r + 1}/{rounds}")
        rate, per = await _accepts(api, cfg, n, f"a{r}")
        ours.append(rate)
        trips.append(per)
        floor.append(await _floor(cfg, n, f"f{r}"))
    ratios = sorted(o / f for o, f in zip(ours, floor, strict=True))
    drain_rate, drain_trips = await _drain(api, cfg, n)
    idle = await _latency(api, cfg, 100 if cfg.quick else 300, loaded=False)
    loaded = await _latency(api, cfg, 100 if cfg.quick else 300, loaded=True)
    median = ratios[len(ratios) // 2]
    rows = [
        ("accepts/s, asynclock (median)", fmt(sorted(ours)[len(ours) // 2], 0)),
        (
            "accepts/s, floor: same script by redis.asyncio (median)",
            fmt(sorted(floor)[len(floor) // 2], 0),
        ),
        (
            "accept / floor (median of per-round ratios; min-max)",
            f"{median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})",
        ),
        ("round trips per accept", f"{sorted(trips)[len(trips) // 2]:.2f}"),
        (f"drain: events/s, one serve(), {KEYS} keys", fmt(drain_rate, 0)),
        (
            "round trips per drained event (lock, steps, subscription, rescans)",
            f"{drain_trips:.2f}",
        ),
        (
            "accept -> handler start, idle: p50 / p99 ms",
            f"{_pct(idle, 0.5) * 1000:.2f} / {_pct(idle, 0.99) * 1000:.2f}",
        ),
        (
            "accept -> handler start, under load: p50 / p99 ms",
            f"{_pct(loaded, 0.5) * 1000:.2f} / {_pct(loaded, 0.99) * 1000:.2f}",
        ),
    ]
    body = (
        "The durable inbox on Redis: `accept` against the raw EVALSHA of the same script, the drain "
        "of one `serve()`, and the time from `accept` to the handler starting.\n\n"
        + kv_table(rows)
        + "\n"
    )
    headlines = [
        ("inbox accept / floor", f"{median:.2f}x"),
        ("inbox p50 idle", f"{_pct(idle, 0.5) * 1000:.2f} ms"),
    ]
    return Section("inbox", body, headlines)
