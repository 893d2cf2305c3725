"""Scenario ``dispatcher``: EventDispatcher throughput and state round trips per event.

Memory and Redis rows (asynclock, the plain or raw floor, chat-sdk), serial and burst, then one
counting pass per Redis row. What each row runs: docs/benchmarks.md, the ``dispatcher`` block.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio

from benchmarks.harness.dispatching import (
    AsynclockDispatcher,
    ChatSdk,
    Dispatching,
    Floor,
    Plain,
    SendCounter,
    chat_sdk,
    dispatch_rounds,
    drive,
    events,
    rate_columns,
    set_up_rows,
)
from benchmarks.harness.env import (
    Asynclock,
    CommandCounter,
    Config,
    commit,
    dist_version,
    log,
    now_utc,
    short,
)
from benchmarks.harness.report import Column, Headlines, Rounds, Section, kept, table
from benchmarks.harness.rounds import teardown
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.stats import fmt, fmt_spread

M_PLAIN = "plain dict[str, asyncio.Lock] + set (serial)"
M_ASYNCLOCK = "**asynclock** EventDispatcher(MemoryState()) (serial)"
M_CHAT = "chat-sdk Chat(MemoryStateAdapter), drop (serial)"
M_PLAIN_B = "plain dict[str, asyncio.Lock] + set (burst)"
M_ASYNCLOCK_B = "**asynclock** EventDispatcher(MemoryState(), queue) (burst)"
M_CHAT_B = "chat-sdk Chat(MemoryStateAdapter), queue (burst)"
# chat-sdk's queue hands the holder only the newest waiting message, the rest in
# context.skipped: asynclock's `latest` does that (its `queue` runs every event)
M_ASYNCLOCK_L = "**asynclock** EventDispatcher(MemoryState(), latest) (burst)"
R_FLOOR1 = "floor: redis.asyncio, 1 connection, 1 task"
R_FLOORK = "floor: redis.asyncio, one producer per key, pool of 50 (serial)"
R_ASYNCLOCK = "**asynclock** EventDispatcher(RedisState) (serial)"
R_CHAT = "chat-sdk Chat(RedisStateAdapter), drop (serial)"
R_ASYNCLOCK_B = "**asynclock** EventDispatcher(RedisState, queue) (burst)"
R_CHAT_B = "chat-sdk Chat(RedisStateAdapter), queue (burst)"
R_ASYNCLOCK_L = "**asynclock** EventDispatcher(RedisState, latest) (burst)"

MEMORY_ROWS = (M_PLAIN, M_ASYNCLOCK, M_CHAT, M_PLAIN_B, M_ASYNCLOCK_B, M_ASYNCLOCK_L, M_CHAT_B)
REDIS_ROWS = (R_FLOOR1, R_FLOORK, R_ASYNCLOCK, R_CHAT, R_ASYNCLOCK_B, R_ASYNCLOCK_L, R_CHAT_B)
# for each row: the reference rows its ratios are taken against (same arrival), by column tag
REFS: dict[str, dict[str, str]] = {
    M_ASYNCLOCK: {"plain": M_PLAIN, "chat": M_CHAT},
    M_CHAT: {"plain": M_PLAIN},
    M_ASYNCLOCK_B: {"plain": M_PLAIN_B, "chat": M_CHAT_B},
    M_ASYNCLOCK_L: {"plain": M_PLAIN_B, "chat": M_CHAT_B},
    M_CHAT_B: {"plain": M_PLAIN_B},
    R_FLOORK: {"floor1": R_FLOOR1},
    R_ASYNCLOCK: {"floor1": R_FLOOR1, "floork": R_FLOORK, "chat": R_CHAT},
    R_CHAT: {"floor1": R_FLOOR1, "floork": R_FLOORK},
    R_ASYNCLOCK_B: {"floor1": R_FLOOR1, "floork": R_FLOORK, "chat": R_CHAT_B},
    R_ASYNCLOCK_L: {"floor1": R_FLOOR1, "floork": R_FLOORK, "chat": R_CHAT_B},
    R_CHAT_B: {"floor1": R_FLOOR1, "floork": R_FLOORK},
}


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 2000 if cfg.quick else 4000
    keys = 50
    rounds_n = cfg.rounds_or(7, 3)
    mem, red = Rounds(), Rounds()
    for name in MEMORY_ROWS:
        mem.declare(name)
    for name in REDIS_ROWS:
        red.declare(name)
    sdk = chat_sdk()
    variants: list[Dispatching] = [
        Plain(M_PLAIN, burst=False),
        Plain(M_PLAIN_B, burst=True),
        Floor(R_FLOOR1, cfg, one_connection=True),
        Floor(R_FLOORK, cfg, one_connection=False),
    ]
    if isinstance(api, str):
        for name in (M_ASYNCLOCK, M_ASYNCLOCK_B, M_ASYNCLOCK_L):
            mem.skip(name, api)
        for name in (R_ASYNCLOCK, R_ASYNCLOCK_B, R_ASYNCLOCK_L):
            red.skip(name, api)
    else:
        prefix = cfg.key("dispatcher", "asynclock") + ":"

        def memory_state() -> Any:
            return api.memory_state()

        def redis_state() -> Any:
            return api.redis_state(cfg.url, prefix)

        variants += [
            AsynclockDispatcher(M_ASYNCLOCK, api, memory_state, burst=False, redis=False),
            AsynclockDispatcher(M_ASYNCLOCK_B, api, memory_state, burst=True, redis=False),
            AsynclockDispatcher(R_ASYNCLOCK, api, redis_state, burst=False, redis=True),
            AsynclockDispatcher(R_ASYNCLOCK_B, api, redis_state, burst=True, redis=True),
            AsynclockDispatcher(
                M_ASYNCLOCK_L, api, memory_state, burst=True, redis=False, latest=True
            ),
            AsynclockDispatcher(
                R_ASYNCLOCK_L, api, redis_state, burst=True, redis=True, latest=True
            ),
        ]
    if isinstance(sdk, str):
        for name in (M_CHAT, M_CHAT_B):
            mem.skip(name, sdk)
        for name in (R_CHAT, R_CHAT_B):
            red.skip(name, sdk)
    else:
        variants += [
            ChatSdk(M_CHAT, sdk, cfg, burst=False, redis=False),
            ChatSdk(M_CHAT_B, sdk, cfg, burst=True, redis=False),
            ChatSdk(R_CHAT, sdk, cfg, burst=False, redis=True),
            ChatSdk(R_CHAT_B, sdk, cfg, burst=True, redis=True),
        ]

    def rows(variant: Dispatching) -> Rounds:
        return red if variant.redis else mem

    warmup = min(n, 500)
    live = await set_up_rows(variants, rows, warmup=warmup, keys=keys, scenario="dispatcher")
    started = now_utc()
    await dispatch_rounds(
        live, variants, rows, n=n, keys=keys, rounds_n=rounds_n, refs=REFS, scenario="dispatcher"
    )

    redis_live = [v for v in live if v.redis]
    trips = await _count_round_trips(cfg, redis_live, n, keys)
    for variant in live:
        await teardown(variant, "dispatcher")
    versions = {"chat-sdk": dist_version("chat-sdk"), "git": commit()}
    return _section(cfg, mem, red, trips, n, keys, rounds_n, started, versions)


async def _count_round_trips(cfg: Config, variants: list[Dispatching], n: int, keys: int) -> Rounds:
    """One more run per Redis variant, counting sends (client) and commands (server)."""
    trips = Rounds()
    for name in REDIS_ROWS:
        trips.declare(name)
    monitor = redis.asyncio.Redis.from_url(cfg.url)
    server = CommandCounter(monitor)
    sends = SendCounter()
    try:
        for index, variant in enumerate(variants):
            per_key = events(variant, f"count-v{index}", n, keys)
            variant.reset()
            await server.start()
            before = sends.sends
            try:
                with sends.counting():
                    await drive(variant, per_key)
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                trips.skip(variant.name, f"{type(exc).__name__}: {exc}")
                continue
            metrics = {
                "trips_event": (sends.sends - before) / n,
                "cmds_event": (await server.stop()) / n,
            }
            if not variant.burst and not isinstance(variant, Floor):
                # redeliveries of events already handled: the dedupe check alone
                again = [events[: max(1, 200 // keys)] for events in per_key]
                count = sum(len(events) for events in again)
                before = sends.sends
                handled = variant.handled
                with sends.counting():
                    await drive(variant, again)
                metrics["trips_duplicate"] = (sends.sends - before) / count
                if variant.handled != handled:
                    trips.skip(variant.name, "a redelivered event was handled again")
            trips.add(variant.name, metrics)
            log(
                f"dispatcher round trips: {short(variant.name)}: {metrics['trips_event']:.2f}/event"
            )
    finally:
        await monitor.aclose()
    return trips


def _section(
    cfg: Config,
    mem: Rounds,
    red: Rounds,
    trips: Rounds,
    n: int,
    keys: int,
    rounds_n: int,
    started: str,
    versions: dict[str, str],
) -> Section:
    mem_cols = [
        *rate_columns(),
        Column("÷ plain (throughput)", "x_plain", 2),
        Column("÷ chat-sdk (throughput)", "x_chat", 2),
        *_outcome_columns(),
    ]
    red_cols = [
        *rate_columns(),
        Column("÷ floor, 1 connection", "x_floor1", 2),
        Column("÷ floor, per-key producers", "x_floork", 2),
        Column("÷ chat-sdk (throughput)", "x_chat", 2),
        *_outcome_columns(),
    ]
    trip_cols = [
        Column("round trips per event", "trips_event", 2, median_only=True),
        Column("Redis commands per event (incl. inside scripts)", "cmds_event", 2, True),
        Column("round trips per redelivered duplicate", "trips_duplicate", 2, True),
    ]
    body = [
        "## Dispatcher: EventDispatcher events/s and round trips per event",
        "",
        (
            f"{n:,} events over {keys} thread keys per variant and round (event i on key i mod "
            f"{keys}, each with a fresh message id), {rounds_n} rounds, all variants of both "
            "tables interleaved round-robin (the starting variant rotates)."
        ),
        "",
        kept("dispatcher-intro"),
        "",
        (
            f"Started {started} against `{cfg.url}`, run {cfg.run_id} at asynclock git "
            f"{versions['git']}; chat-sdk {versions['chat-sdk']}."
        ),
        "",
        "### Memory: the in-process ideal",
        "",
        table(mem, mem_cols),
        "",
        "### Redis: the raw floor and chat-sdk",
        "",
        table(red, red_cols),
        "",
        "### State round trips per event (Redis)",
        "",
        (
            f"One more run of each Redis variant after the timed rounds ({n:,} fresh events, then "
            f"{keys * max(1, 200 // keys)} of them redelivered where dedupe applies)."
        ),
        "",
        kept("dispatcher-trips"),
        "",
        table(trips, trip_cols),
        "",
        kept("dispatcher-rows"),
    ]
    body += ["", *_reading(mem, red, trips)]
    headlines = _headlines(mem, red, trips)
    return Section("dispatcher", "\n".join(body), headlines)


def _outcome_columns() -> list[Column]:
    """What each contender did with the events, counted from what ran (see ``_counted``)."""
    return [
        Column("handled events/s (handler calls)", "handled_s"),
        Column("÷ chat-sdk (handled/s)", "xh_chat", 2),
        Column("handler calls", "handled"),
        Column("skipped (seen in context.skipped)", "skipped"),
        Column("dropped (never seen by a handler)", "dropped"),
        Column("of which refused (LockError)", "rejected"),
    ]


def _reading(mem: Rounds, red: Rounds, trips: Rounds) -> list[str]:
    """The short reading of this run's numbers, written from them."""
    lines = ["### Reading the dispatcher numbers", ""]

    def med(rounds: Rounds, row: str, metric: str, digits: int) -> str:
        return fmt(rounds.spread(row, metric).median, digits)

    def spread(rounds: Rounds, row: str, metric: str) -> str:
        return fmt_spread(rounds.spread(row, metric), 2)

    uncontended = trips.spread(R_ASYNCLOCK, "trips_event")
    if uncontended.count:
        verdict = "meets" if uncontended.median <= 2.0 + 1e-9 else "**misses**"
        lines.append(
            f"- Round trips: a fresh uncontended event costs asynclock "
            f"**{fmt(uncontended.median, 2)}** round trips on Redis, which {verdict} the target "
            "of at most 2 (dedupe claim + lock in one script, then release + claim done in one), as many as the "
            f"floor; a redelivered duplicate costs {med(trips, R_ASYNCLOCK, 'trips_duplicate', 2)} "
            f"(the claim script answers at once). chat-sdk needs "
            f"{med(trips, R_CHAT, 'trips_event', 2)} (dedupe, lock, subscription check, "
            f"release). Under the burst asynclock needs "
            f"{med(trips, R_ASYNCLOCK_B, 'trips_event', 2)} per event. Inside "
            f"the scripts asynclock runs {med(trips, R_ASYNCLOCK, 'cmds_event', 1)} server "
            f"commands per event against the floor's {med(trips, R_FLOOR1, 'cmds_event', 1)} "
            "(fencing token from `TIME`, the abandon mark, the release `PUBLISH`)."
        )
    x_floor = red.spread(R_ASYNCLOCK, "x_floor1")
    if x_floor.count:
        if x_floor.low < 1.0 < x_floor.high:
            where = (
                "level with the floor within this run's spread (its rounds fall on both sides of 1)"
            )
        elif x_floor.median < 1.0:
            where = "below the floor"
        else:
            where = "above the floor"
        cpu = red.spread(R_ASYNCLOCK, "cpu_us_event").median
        cpu_floor = red.spread(R_FLOORK, "cpu_us_event").median
        if cpu <= cpu_floor * 1.15:
            cpu_text = (
                "about the floor's or less, so the dispatcher's own work (an `AsyncLock`, its "
                "renewal watchdog task, the outcome record) is offset by its lean connection "
                "pool, which spends less per command than redis-py's `execute_command` that the "
                "floor goes through."
            )
        else:
            cpu_text = (
                "the excess over the floor is the dispatcher's own work (an `AsyncLock`, its "
                "renewal watchdog task, the outcome record)."
            )
        lines.append(
            f"- Redis: asynclock handles {med(red, R_ASYNCLOCK, 'events_s', 0)} events/s in "
            f"serial: {spread(red, R_ASYNCLOCK, 'x_floor1')} x the 1-connection floor and "
            f"{spread(red, R_ASYNCLOCK, 'x_floork')} x the floor with the same per-key "
            f"producers, so {where}, with the same number of round trips. Client CPU per "
            f"event: asynclock {med(red, R_ASYNCLOCK, 'cpu_us_event', 0)} µs, the floors "
            f"{med(red, R_FLOOR1, 'cpu_us_event', 0)} and {med(red, R_FLOORK, 'cpu_us_event', 0)} "
            f"µs: {cpu_text} Against chat-sdk with the same "
            f"arrival: {spread(red, R_ASYNCLOCK, 'x_chat')} x in serial and "
            f"{spread(red, R_ASYNCLOCK_B, 'x_chat')} x in the burst, where asynclock handles "
            f"every event and chat-sdk calls its handler {med(red, R_CHAT_B, 'handled', 0)} "
            f"times, covering {med(red, R_CHAT_B, 'covered', 0)} events (the rest fell out of "
            "its queue)."
        )
    x_plain = mem.spread(M_ASYNCLOCK, "x_plain")
    if x_plain.count:
        lines.append(
            f"- Memory: asynclock's dispatcher runs at {fmt_spread(x_plain, 2)} x the plain "
            f"dict-of-asyncio.Lock in serial and {spread(mem, M_ASYNCLOCK_B, 'x_plain')} x in "
            f"the burst, and at {spread(mem, M_ASYNCLOCK, 'x_chat')} x chat-sdk's memory path "
            "in serial."
        )
    chat_calls = mem.spread(M_CHAT_B, "handled")
    if chat_calls.count:
        lines.append(
            f"- Memory burst, what chat-sdk did with the events: {med(mem, M_CHAT_B, 'handled', 0)} "
            f"handler calls, {med(mem, M_CHAT_B, 'skipped', 0)} more events seen only in "
            f"`context.skipped`, {med(mem, M_CHAT_B, 'dropped', 0)} dropped unseen by its "
            f"queue (drop-oldest, silent), {med(mem, M_CHAT_B, 'stranded', 0)} left queued; "
            f"asynclock handled {med(mem, M_ASYNCLOCK_B, 'handled', 0)} and dropped "
            f"{med(mem, M_ASYNCLOCK_B, 'dropped', 0)}. Per second of the run: "
            f"{spread(mem, M_ASYNCLOCK_B, 'x_chat')} x chat-sdk's dispatch calls and "
            f"{spread(mem, M_ASYNCLOCK_B, 'xh_chat')} x its handled events."
        )
    folded = mem.spread(M_ASYNCLOCK_L, "x_chat")
    if folded.count:
        lines.append(
            f"- Memory burst under `latest`, chat-sdk's own semantics (the newest waiting event "
            f"handled, the rest in `ctx.skipped`): asynclock made "
            f"{med(mem, M_ASYNCLOCK_L, 'handled', 0)} handler calls that saw all "
            f"{med(mem, M_ASYNCLOCK_L, 'covered', 0)} events (dropped "
            f"{med(mem, M_ASYNCLOCK_L, 'dropped', 0)}), at {fmt_spread(folded, 2)} x chat-sdk's "
            f"dispatch calls per second ({spread(mem, M_ASYNCLOCK_L, 'x_plain')} x the plain "
            "baseline, which runs every event)."
        )
    return lines


def _headlines(mem: Rounds, red: Rounds, trips: Rounds) -> list[tuple[str, str]]:
    out = Headlines()

    def add(label: str, rounds: Rounds, row: str, metric: str, digits: int) -> None:
        out.metric(label, rounds, row, metric, digits, missing="n/a (see the table)")

    add("dispatcher on Redis, serial events/s", red, R_ASYNCLOCK, "events_s", 0)
    add("dispatcher on Redis ÷ raw floor (1 connection)", red, R_ASYNCLOCK, "x_floor1", 2)
    add("dispatcher on Redis ÷ raw floor (per-key producers)", red, R_ASYNCLOCK, "x_floork", 2)
    add("dispatcher on Redis ÷ chat-sdk (drop), serial", red, R_ASYNCLOCK, "x_chat", 2)
    add("dispatcher on Redis, burst (queue) events/s", red, R_ASYNCLOCK_B, "events_s", 0)
    add("dispatcher on Memory ÷ plain dict of asyncio.Lock, serial", mem, M_ASYNCLOCK, "x_plain", 2)
    add(
        "dispatcher on Memory ÷ plain dict of asyncio.Lock, burst", mem, M_ASYNCLOCK_B, "x_plain", 2
    )
    add("dispatcher on Memory ÷ chat-sdk, burst (latest)", mem, M_ASYNCLOCK_L, "x_chat", 2)
    add(
        "Redis round trips per fresh event, uncontended (target <= 2)",
        trips,
        R_ASYNCLOCK,
        "trips_event",
        2,
    )
    add("Redis round trips per event, burst (queue)", trips, R_ASYNCLOCK_B, "trips_event", 2)
    add("chat-sdk Redis round trips per event (drop)", trips, R_CHAT, "trips_event", 2)
    return out.rows


SCENARIO = Scenario("dispatcher", run)
