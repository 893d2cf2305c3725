"""Scenario ``inbox``: the durable inbox on Redis (#12), beside the chat-sdk queue.

* **accept throughput**: serial ``EventDispatcher.accept`` calls over 20 keys, against the floor
  of the same server work: the same ``inbox_accept.lua`` sent with ``redis.asyncio``'s own
  ``register_script`` (EVALSHA) on one connection, same keys and arguments; and against
  chat-sdk's enqueue on the same server and keys (``_inbox_peer.py``), in the same rounds.
* **round trips per event**: connection sends counted on the client while accepting, and while
  one ``serve()`` drains what was accepted (subscription and rescans included).
* **accept -> handler start**: one event at a time accepted while a ``serve()`` runs in the same
  process, the time from calling ``accept`` until its handler starts; idle, and under a load of
  1,000 events/s to 10 other keys (``offered_load``, the same for both). chat-sdk: ``handle_incoming_message`` on an idle thread
  until its handler starts (in the caller).
* **burst**: 2,000 events over the 20 keys, all at once and evenly over a second (a ``serve()``
  running; chat-sdk: ``handle_incoming_message`` calls), then what became of each: handled,
  folded, stranded in a queue with no holder, dropped; and the round trips per event, drain
  included.
"""

from __future__ import annotations

import asyncio
import functools
import os
import secrets
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness.dispatching import SendCounter, chat_sdk
from benchmarks.harness.env import Config, dist_version, git, log, now_utc
from benchmarks.harness.report import Section, kept
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.stats import Spread, fmt, fmt_spread
from benchmarks.scenarios import _inbox_peer as peer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from benchmarks.harness.env import Asynclock

KEYS = 20
NAMES = [f"T{i}" for i in range(KEYS)]
#: seconds a burst may take to be handled before what is left counts as stranded
BURST_BOUND = 60.0
#: how the burst's events arrive: all at once, and evenly over a second (about chat-sdk's pace)
SPREADS = (0.0, 1.0)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Countdown:
    """A handler that counts its calls and sets ``done`` at the ``target``-th; each call then
    yields ``pause`` seconds (``None``: returns without an await)."""

    def __init__(self, target: int, pause: float | None = None) -> None:
        self.handled = 0
        self.target = target
        self.pause = pause
        self.done = asyncio.Event()

    def expect(self, target: int) -> None:
        """Count afresh, up to ``target``."""
        self.handled, self.target = 0, target
        self.done.clear()

    async def __call__(self, event: Any) -> None:
        self.handled += 1
        if self.handled == self.target:
            self.done.set()
        if self.pause is not None:
            await asyncio.sleep(self.pause)


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
    # asynclock's own composition of the script (its preludes change with the package)
    from asynclock.state.redis._scripts import load_scripts

    script = client.register_script(load_scripts()["inbox_accept"].text)
    prefix = cfg.key("inbox-floor", tag)
    ready, mark, wake = f"{prefix}:ready", f"{prefix}:listed", f"{prefix}:wake"
    t0 = time.perf_counter()
    for i in range(n):
        lock = f"{prefix}:{{k{i % KEYS}}}"
        base = f"{lock}:inbox"
        claim, attempts, hold = f"{base}:claim:{i}", f"{base}:attempts", f"{base}:hold"
        keys = [base, f"{base}:seq", ready, claim, mark, lock, attempts, hold]
        # listing '': one server has one set of keys with work, always listed (_listed.lua);
        # then the hand-out (_handout.lua): the lane, a fresh owner, its ttl_ms, the entry along
        owner = f"inbox-handout:{secrets.token_hex(8)}"
        args: list[str | int] = [f'{{"n":{i}}}', 10**6, 600_000, f"k{i % KEYS}", "1", ""]
        args += [wake, owner, 30_000, "1"]
        await script(keys=keys, args=args)
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
    handler = Countdown(n)
    bot.add_handler("*", handler)
    sends = SendCounter()
    with sends.counting():
        t0 = time.perf_counter()
        task = asyncio.create_task(bot.serve())
        await asyncio.wait_for(handler.done.wait(), 120)
        elapsed = time.perf_counter() - t0
        await bot.aclose()
        await task
    await state.aclose()
    return n / elapsed, sends.sends / n


#: how many workers share the inbox in the ``workers`` measurement (each on a client of its own)
WORKERS = (1, 3, 6)
#: accepts in flight at once there (a webhook server's concurrent requests)
IN_FLIGHT = 50


async def _workers(api: Any, cfg: Config, n: int, m: int, tag: str) -> tuple[float, float]:
    """(seconds, round trips per event) for ``n`` events accepted ``IN_FLIGHT`` at a time while
    ``m`` workers drain them, each ``serve()`` on a client of its own (as processes have) and its
    handler taking 1 ms; every client's sends counted, the accepts' included."""
    prefix = cfg.key("inbox", "workers", tag) + ":"
    handler = Countdown(1, pause=0.001)  # the first event warms every worker's path up

    def dispatcher() -> Any:
        state = api.module.RedisState.from_url(cfg.url, prefix=prefix)
        bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
        bot.add_handler("*", handler)
        return bot

    producer, workers = dispatcher(), [dispatcher() for _ in range(m)]
    serving = [asyncio.create_task(bot.serve()) for bot in workers]
    event = api.module.Event
    await producer.accept(event("message", "bench", "C", "warm", f"{tag}-warm"))
    await asyncio.wait_for(handler.done.wait(), 30)
    handler.expect(n)
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def accept(i: int) -> None:
        async with gate:
            await producer.accept(event("message", "bench", "C", f"T{i % KEYS}", f"{tag}-{i}"))

    sends = SendCounter()
    with sends.counting():
        t0 = time.perf_counter()
        await asyncio.gather(*(accept(i) for i in range(n)))
        await asyncio.wait_for(handler.done.wait(), 120)
        elapsed = time.perf_counter() - t0
    bots = (*workers, producer)
    for bot in bots:
        await bot.aclose()
    await asyncio.gather(*serving)  # every serve() done before its state is closed
    for bot in bots:
        await bot.state.aclose()
    return elapsed, sends.sends / n


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

    async def send(i: int) -> None:
        await bot.accept(event("message", "bench", "C", f"L{i % 10}", f"load-{i}"))

    load = asyncio.create_task(peer.offered_load(send, stop)) if loaded else None
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


async def _burst(api: Any, cfg: Config, n: int, tag: str, spread: float) -> peer.Burst:
    """``n`` events over the keys, the ``accept`` calls started evenly over ``spread`` seconds
    (0: all at once) while one ``serve()`` drains."""
    state = api.module.RedisState.from_url(cfg.url, prefix=cfg.key("inbox", tag) + ":")
    bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
    event = api.module.Event
    events = [event("message", "bench", "C", NAMES[i % KEYS], f"{tag}-{i}") for i in range(n)]
    handler = Countdown(n, pause=0)
    bot.add_handler("*", handler)
    serving = asyncio.create_task(bot.serve())
    sends = SendCounter()
    with sends.counting():
        t0 = time.perf_counter()
        await peer.arriving([functools.partial(bot.accept, e) for e in events], spread)
        try:
            await asyncio.wait_for(handler.done.wait(), BURST_BOUND)
        except TimeoutError:
            left = n - handler.handled
            log(f"inbox: burst {tag}: {left} events not handled within {BURST_BOUND} s")
        elapsed = time.perf_counter() - t0
        await bot.aclose()
        await serving
    await state.aclose()
    # accept() refuses rather than drops (InboxFullError), so nothing is dropped by design
    handled = handler.handled
    return peer.Burst(n, elapsed, handled, 0, n - handled, 0, sends.sends / n)


def _ms(samples: list[float]) -> str:
    return f"{_pct(samples, 0.5) * 1000:.2f} / {_pct(samples, 0.99) * 1000:.2f}"


def _ratio(ours: list[float], theirs: list[float]) -> str:
    """Median (min-max) of the per-round ratios ``ours / theirs``."""
    return fmt_spread(Spread.of(o / t for o, t in zip(ours, theirs, strict=True)), 2) + "x"


def _table(headers: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("inbox", f"skipped: {api}\n")
    sdk = chat_sdk()
    if isinstance(sdk, str):
        return Section("inbox", f"skipped: the peer is missing: {sdk}\n")
    n = 500 if cfg.quick else 2000
    rounds = cfg.rounds_or(5, 3)
    started = now_utc()
    load = os.getloadavg()[0]  # the machine is shared: other processes' load moves the numbers
    ours: list[float] = []
    floor: list[float] = []
    trips: list[float] = []
    chat: list[float] = []
    chat_trips: list[float] = []
    chat_store: list[float] = []
    for r in range(rounds):
        log(f"inbox: accept / enqueue round {r + 1}/{rounds}")
        rate, per = await _accepts(api, cfg, n, f"a{r}")
        ours.append(rate)
        trips.append(per)
        floor.append(await _floor(cfg, n, f"f{r}"))
        rate, per = await peer.enqueue_rate(sdk, cfg, n, NAMES, f"c{r}")
        chat.append(rate)
        chat_trips.append(per)
        chat_store.append(await peer.adapter_enqueue_rate(sdk, cfg, n, NAMES, f"s{r}"))
    log("inbox: drain and latency")
    drain_rate, drain_trips = await _drain(api, cfg, n)
    shared: dict[int, list[tuple[float, float]]] = {m: [] for m in WORKERS}
    for r in range(rounds):
        log(f"inbox: workers round {r + 1}/{rounds}")
        for m in WORKERS:
            shared[m].append(await _workers(api, cfg, n, m, f"w{r}-{m}"))
    probes = 100 if cfg.quick else 300
    idle = await _latency(api, cfg, probes, loaded=False)
    loaded = await _latency(api, cfg, probes, loaded=True)
    chat_idle = await peer.latency(sdk, cfg, probes, loaded=False)
    chat_loaded = await peer.latency(sdk, cfg, probes, loaded=True)
    bursts: dict[tuple[str, float], list[peer.Burst]] = {
        (who, spread): [] for spread in SPREADS for who in ("asynclock", "chat", "chat-unbounded")
    }
    for r in range(rounds):
        log(f"inbox: burst round {r + 1}/{rounds}")
        for i, spread in enumerate(SPREADS):
            tag = f"b{r}-{i}"
            bursts["asynclock", spread].append(await _burst(api, cfg, n, tag, spread))
            bursts["chat", spread].append(
                await peer.burst(
                    sdk, cfg, n, NAMES, tag, max_queue_size=peer.DEFAULT_QUEUE, spread=spread
                )
            )
            bursts["chat-unbounded", spread].append(
                await peer.burst(sdk, cfg, n, NAMES, f"u{tag}", max_queue_size=n, spread=spread)
            )
    median = Spread.of(o / f for o, f in zip(ours, floor, strict=True)).median
    body = _body(
        cfg,
        started=started,
        load=load,
        n=n,
        rounds=rounds,
        throughput=[
            ("**asynclock** `accept`", ours, trips, floor, chat),
            ("floor: the same script by redis.asyncio, 1 connection", floor, [1.0], floor, chat),
            (
                "chat-sdk `handle_incoming_message`, thread busy (enqueue path)",
                chat,
                chat_trips,
                floor,
                chat,
            ),
            (
                "chat-sdk `RedisStateAdapter.enqueue` alone (no dedupe)",
                chat_store,
                [1.0],
                floor,
                chat,
            ),
        ],
        drain=(drain_rate, drain_trips),
        shared=shared,
        latencies=[
            ("**asynclock** `accept` -> `serve()` handler", idle, loaded),
            (
                "chat-sdk `handle_incoming_message` -> handler (inline, idle thread)",
                chat_idle,
                chat_loaded,
            ),
        ],
        bursts=bursts,
    )
    headlines = [
        ("inbox accept / floor", f"{median:.2f}x"),
        ("inbox accept / chat-sdk enqueue path", _ratio(ours, chat)),
        ("inbox p50 idle", f"{_pct(idle, 0.5) * 1000:.2f} ms"),
        (
            "inbox burst stranded+dropped: asynclock / chat-sdk (median of rounds)",
            (
                f"{_median(b.stranded + b.dropped for b in bursts['asynclock', 0.0]):.0f} / "
                f"{_median(b.stranded + b.dropped for b in bursts['chat', 0.0]):.0f} of {n}"
            ),
        ),
    ]
    return Section("inbox", body, headlines)


def _median(values: Any) -> float:
    return Spread.of(values).median


def _body(
    cfg: Config,
    *,
    started: str,
    load: float,
    n: int,
    rounds: int,
    throughput: list[tuple[str, list[float], list[float], list[float], list[float]]],
    drain: tuple[float, float],
    shared: dict[int, list[tuple[float, float]]],
    latencies: list[tuple[str, list[float], list[float]]],
    bursts: dict[tuple[str, float], list[peer.Burst]],
) -> str:
    """The section's text: three tables side by side with chat-sdk, one line per figure."""
    accept_rows = [
        (
            name,
            fmt_spread(Spread.of(rates), 0),
            _ratio(rates, floor),
            _ratio(rates, chat),
            f"{_median(per):.2f}",
        )
        for name, rates, per, floor, chat in throughput
    ]
    latency_rows = [(name, _ms(idle), _ms(loaded)) for name, idle, loaded in latencies]
    labels = {
        "asynclock": "**asynclock** `accept`, one `serve()`",
        "chat": f"chat-sdk queue, defaults (`max_queue_size={peer.DEFAULT_QUEUE}`, drop-oldest)",
        "chat-unbounded": f"chat-sdk queue, `max_queue_size={n}`",
    }
    burst_rows = []
    for (name, spread), results in bursts.items():
        arrival = "all at once" if not spread else f"over {spread:g} s"
        strandings = (
            "none: release-if-empty is one step"
            if name == "asynclock"
            else fmt_spread(Spread.of(b.stranding_releases for b in results), 0)
            + " ("
            + fmt_spread(Spread.of(b.left_behind for b in results), 0)
            + f" entries); {sum(b.stranding_releases for b in results)} in all"
        )
        burst_rows.append(
            (
                f"{labels[name]}, {arrival}",
                fmt_spread(Spread.of(b.rate for b in results), 0),
                fmt_spread(Spread.of(b.handled for b in results), 0),
                fmt_spread(Spread.of(b.skipped for b in results), 0),
                fmt_spread(Spread.of(b.stranded for b in results), 0),
                fmt_spread(Spread.of(b.dropped for b in results), 0),
                strandings,
                fmt_spread(Spread.of(b.trips for b in results), 2),
            )
        )
    facts = (
        f"Run {started} against {cfg.url} (chat-sdk {dist_version('chat-sdk')}, "
        f"redis-py {dist_version('redis')}, git {git('rev-parse', '--short', 'HEAD')}, "
        f"1-minute load average {load:.1f} on 2 cores when it started); {rounds} rounds, "
        "interleaved; cells are median (min-max) over the rounds."
    )
    return "\n\n".join(
        [
            kept("inbox-intro"),
            facts,
            f"**Storing an event for a later handler**, {n} serial calls per round:",
            _table(
                ("what", "events/s", "÷ floor", "÷ chat-sdk enqueue path", "round trips / event"),
                accept_rows,
            ),
            (
                f"Drain: one `serve()` handles {n} accepted events at {fmt(drain[0], 0)} events/s, "
                f"{drain[1]:.2f} round trips per event (lock, steps, subscription, rescans)."
            ),
            (
                f"**Workers sharing the inbox**: {n} events over the {KEYS} keys accepted "
                f"{IN_FLIGHT} at a time while 1, 3 or 6 workers drain them (each `serve()` on a "
                "client of its own, as processes have; the handler takes 1 ms), so the keys "
                "are mostly busy."
            ),
            kept("inbox-workers"),
            _table(
                ("workers", "seconds until all handled", "round trips / event"),
                [
                    (
                        str(m),
                        fmt_spread(Spread.of(t for t, _ in results), 2),
                        fmt_spread(Spread.of(p for _, p in results), 2),
                    )
                    for m, results in shared.items()
                ],
            ),
            (
                "**From the call until the handler starts**, one event at a time, p50 / p99 ms "
                f"(under load: {peer.LOAD_RATE:,} more events per second to 10 other keys, each "
                "call in a task of its own):"
            ),
            _table(("what", "idle", "under load"), latency_rows),
            (
                f"**A burst**: {n} events over the {KEYS} keys, all at once or arriving evenly "
                "over a second."
            ),
            kept("inbox-burst"),
            _table(
                (
                    "what",
                    "events/s reaching a handler",
                    "handler calls",
                    "folded (`skipped`)",
                    "stranded at the end",
                    "dropped",
                    "releases that left entries without a holder (per round; all rounds)",
                    "round trips / event",
                ),
                burst_rows,
            ),
        ]
    )


SCENARIO = Scenario("inbox", run, own_environment=True)
