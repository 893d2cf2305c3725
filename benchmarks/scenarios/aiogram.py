"""Scenario ``aiogram``: asynclock's ``EventIsolation`` against aiogram's ``RedisEventIsolation`` (#27).

Both are aiogram's ``events_isolation``: the lock aiogram's FSM middleware holds around the
handling of each update, per user in chat. Two child processes (``_spawn.Children``) each run two
real aiogram ``Dispatcher``\\ s, one per isolation, on the same Redis server; the parent feeds
them updates over a queue (``Dispatcher.feed_update``, as aiogram's webhook handler does, each
update in a task of its own) and the children report, per update, when it arrived, when its
handler started and ended (``perf_counter``: one CLOCK_MONOTONIC for the machine), and how
``feed_update`` ended.

* **burst**: 20 updates of one chat, sent ``SPACING`` apart, alternately to the two processes;
  each handler works 10 ms (or 100 ms), so they pile up behind the chat's lock. Per round and
  isolation: the *handoff* (from a handler's end to the start of the next one, for each next
  update that was already waiting), p50 and p99; the *order* (pairs of updates handled against
  their sending order: 0 is in order); overlaps of two handlers of the chat (isolation lost);
  the burst's time; the Redis commands the server processed meanwhile, per update (the server's
  total, so other clients count too: use ``--private-server`` for clean counts). Isolations
  alternate within a round, the first one rotating.
* **long** (not with ``--quick``): one update whose handler runs ``LONG`` seconds (longer than
  aiogram's 60 s lock timeout) in process 0, and one more of the same chat a second later in
  process 1; both isolations at once, on chats of their own. Per isolation: when the second
  handler started, after the first one's start; how long the two ran together; how the first
  update's ``feed_update`` ended.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness.env import KEY_ROOT, Asynclock, CommandCounter, Config, log
from benchmarks.harness.report import Column, Headlines, Metrics, Rounds, Section, table
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.spawn import Children
from benchmarks.harness.stats import fmt, percentile

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

OURS = "asynclock `EventIsolation` (RedisState, ttl=30 s)"
THEIRS = "aiogram `RedisEventIsolation` (redis-py `Lock`, timeout=60 s)"
VARIANTS = (OURS, THEIRS)
#: the tag a child knows each isolation by
TAGS = {OURS: "asynclock", THEIRS: "aiogram"}
#: the burst's shapes: (processes the burst is spread over, seconds each handler works)
SHAPES = ((1, 0.01), (2, 0.01), (2, 0.1))
#: the burst's rows: (isolation, processes, work)
ROWS = tuple((variant, spread, work) for spread, work in SHAPES for variant in VARIANTS)


def row(variant: str, spread: int, work: float) -> str:
    processes = f"{spread} process{'es' if spread > 1 else ''}"
    return f"{variant}, {processes}, {work * 1000:g} ms handlers"


BURST = 20
SPACING = 0.002
WORK = 0.01
LONG = 70.0
PROCESSES = 2


@dataclass(frozen=True)
class ChildArgs:
    """What a child runs: its index, the Redis URL, the key prefix of this run."""

    index: int
    url: str
    prefix: str


def _update(update_id: int, chat: int, work: float) -> dict[str, Any]:
    """A private-chat text update; its text tells the handler how long to work."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 0,
            "chat": {"id": chat, "type": "private"},
            "from": {"id": chat, "is_bot": False, "first_name": "u"},
            "text": repr(work),
        },
    }


async def _child(args: ChildArgs, commands: Queue[Any], out: Queue[Any]) -> None:
    # imported here: aiogram's models cost seconds of CPU to import, paid by the children only
    from aiogram import Bot, Dispatcher
    from aiogram.fsm.storage.base import DefaultKeyBuilder
    from aiogram.fsm.storage.memory import MemoryStorage
    from aiogram.fsm.storage.redis import RedisEventIsolation
    from aiogram.types import Message, Update

    from asynclock import RedisState
    from asynclock.integrations.aiogram import EventIsolation

    client = redis.asyncio.Redis.from_url(args.url)
    state = RedisState.from_url(args.url, prefix=f"{args.prefix}asynclock:")
    isolations = {
        "asynclock": EventIsolation(state, ttl=30.0),
        "aiogram": RedisEventIsolation(
            client, key_builder=DefaultKeyBuilder(prefix=f"{args.prefix}aiogram")
        ),
    }
    bot = Bot(token="42:BENCHMARK")  # the handlers send nothing: no request leaves
    dispatchers = {}
    for tag, isolation in isolations.items():
        dp = Dispatcher(storage=MemoryStorage(), events_isolation=isolation)

        @dp.message()
        async def work(message: Message, tag: str = tag) -> None:
            started = time.perf_counter()
            await asyncio.sleep(float(message.text or 0))
            out.put(("ran", args.index, tag, message.message_id, started, time.perf_counter()))

        dispatchers[tag] = dp

    async def feed(tag: str, payload: dict[str, Any]) -> None:
        arrived = time.perf_counter()
        out.put(("arrived", args.index, tag, payload["update_id"], arrived))
        error = None
        try:
            await dispatchers[tag].feed_update(bot, Update.model_validate(payload))
        except Exception as exc:  # noqa: BLE001 (reported: it is a result)
            error = f"{type(exc).__name__}: {exc}"
        out.put(("fed", args.index, tag, payload["update_id"], error))

    loop = asyncio.get_running_loop()
    feeding: set[asyncio.Task[None]] = set()
    try:
        for n, tag in enumerate(dispatchers):  # connections, scripts and subscriptions warm
            await feed(tag, _update(-1 - n - 10 * args.index, -1 - args.index, 0.0))
        out.put(("ready", args.index))
        while True:
            command = await loop.run_in_executor(None, commands.get)
            if command is None:
                break
            task = asyncio.ensure_future(feed(*command))
            feeding.add(task)
            task.add_done_callback(feeding.discard)
        await asyncio.gather(*feeding)
    finally:
        await state.aclose()
        await client.aclose()
        await bot.session.close()


def child_main(args: ChildArgs, commands: Queue[Any], out: Queue[Any]) -> None:
    """Entry point of a spawned child."""
    try:
        asyncio.run(_child(args, commands, out))
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", args.index, traceback.format_exc(limit=5)))


@dataclass
class Handled:
    """One update, as its child reported it."""

    update_id: int
    sent: int
    arrived: float = 0.0
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None


class Fleet(Children):
    """The two children, each with a command queue of its own, sharing the report queue."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        prefix = f"{KEY_ROOT}:{cfg.run_id}:aiogram:"
        self.start(
            child_main, [(ChildArgs(i, cfg.url, prefix),) for i in range(PROCESSES)], commands=True
        )
        self.ids = itertools.count(1)

    def reports(self, handled: dict[int, Handled], timeout: float) -> None:
        """Read reports until every update of ``handled`` ran and was fed (or failed)."""
        fed: set[int] = set()
        deadline = time.monotonic() + timeout
        wanted = set(handled)
        while (ran := {u for u, h in handled.items() if h.ended}) != wanted or fed != wanted:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(handled) - (ran & fed))
                raise RuntimeError(f"updates {missing} not reported within {timeout} s")
            message = self.next(remaining)
            record = handled.get(message[3]) if message and len(message) > 3 else None
            if message is None or record is None:
                continue
            kind = message[0]
            if kind == "arrived":
                record.arrived = message[4]
            elif kind == "ran":
                record.started, record.ended = message[4], message[5]
            elif kind == "fed":
                record.error = message[4]
                fed.add(record.update_id)


def burst_metrics(handled: list[Handled]) -> Metrics:
    """Handoff p50/p99 (ms), inversions against the sending order, overlaps, burst time."""
    runs = sorted(handled, key=lambda h: h.started)
    gaps = [
        (after.started - before.ended) * 1000
        for before, after in itertools.pairwise(runs)
        if after.arrived < before.ended  # it was waiting: a handoff, not an idle key
    ]
    order = [h.sent for h in runs]
    inversions = sum(1 for a, b in itertools.combinations(order, 2) if a > b)
    overlaps = sum(
        1 for a, b in itertools.combinations(runs, 2) if a.started < b.ended and b.started < a.ended
    )
    first_sent = min(h.arrived for h in handled)
    return {
        "handoff_p50": percentile(gaps, 50),
        "handoff_p99": percentile(gaps, 99),
        "inversions": float(inversions),
        "in_order": 1.0 if inversions == 0 else 0.0,
        "overlaps": float(overlaps),
        "burst_ms": (max(h.ended for h in handled) - first_sent) * 1000,
        "errors": float(sum(1 for h in handled if h.error)),
    }


async def _burst(
    fleet: Fleet, variant: str, spread: int, work: float, chat: int, counter: CommandCounter
) -> Metrics:
    handled: dict[int, Handled] = {}
    await counter.start()
    for n in range(BURST):
        update_id = next(fleet.ids)
        handled[update_id] = Handled(update_id, n)
        fleet.send(n % spread, (TAGS[variant], _update(update_id, chat, work)))
        await asyncio.sleep(SPACING)  # the sending schedule
    fleet.reports(handled, 60.0)
    commands = await counter.stop()
    metrics = burst_metrics(list(handled.values()))
    metrics["commands_per_update"] = commands / BURST
    return metrics


def _long(fleet: Fleet) -> dict[str, tuple[Handled, Handled]]:
    """Both isolations at once: a ``LONG`` update in process 0, its chat's next in process 1."""
    pairs: dict[str, tuple[Handled, Handled]] = {}
    for n, variant in enumerate(VARIANTS):
        first = Handled(next(fleet.ids), 0)
        fleet.send(0, (TAGS[variant], _update(first.update_id, 900_000 + n, LONG)))
        pairs[variant] = (first, Handled(next(fleet.ids), 1))
    time.sleep(1.0)  # the second update comes a second later, as a user's next message would
    for n, variant in enumerate(VARIANTS):
        second = pairs[variant][1]
        fleet.send(1, (TAGS[variant], _update(second.update_id, 900_000 + n, WORK)))
    fleet.reports({h.update_id: h for pair in pairs.values() for h in pair}, LONG + 90.0)
    return pairs


async def run(cfg: Config, api: Asynclock | str) -> Section:
    rounds_n = cfg.rounds_or(7, 2)
    rounds = Rounds()
    for variant, spread, work in ROWS:
        rounds.declare(row(variant, spread, work))
    if isinstance(api, str):
        return Section("aiogram", "## aiogram isolation\n\n" + api)
    client = redis.asyncio.Redis.from_url(cfg.url)
    counter = CommandCounter(client)
    fleet = Fleet(cfg)
    long_pairs: dict[str, tuple[Handled, Handled]] = {}
    try:
        fleet.collect("ready", PROCESSES, 180)
        for r in range(rounds_n):
            shift = r % len(ROWS)  # the first row rotates
            for v, (variant, spread, work) in enumerate(ROWS[shift:] + ROWS[:shift]):
                chat = 10_000 + 10 * r + v
                metrics = await _burst(fleet, variant, spread, work, chat, counter)
                rounds.add(row(variant, spread, work), metrics)
            log(f"  aiogram burst round {r + 1}/{rounds_n} done")
        # one more burst per row, watched by MONITOR (not timed: MONITOR slows the server): the
        # commands the clients sent (round trips) apart from those the scripts ran
        prefix = f"{KEY_ROOT}:{cfg.run_id}:"
        for v, (variant, spread, work) in enumerate(ROWS):
            sent, scripted = await _watched_burst(fleet, cfg.url, prefix, variant, spread, work, v)
            rounds.data[row(variant, spread, work)][-1].update(
                round_trips=sent / BURST, scripted=scripted / BURST
            )
        if not cfg.quick:
            log(f"  aiogram long handler: about {LONG:.0f} s")
            long_pairs = _long(fleet)
            for variant, (first, second) in long_pairs.items():
                log(
                    f"  {variant}: second started {second.started - first.started:.1f} s after "
                    f"the first, which ended {first.ended - first.started:.1f} s after its start: "
                    f"{first.error or 'returned'}"
                )
    finally:
        fleet.join()
        await client.aclose()
    return Section("aiogram", _markdown(rounds, long_pairs, rounds_n), _headlines(rounds))


COLUMNS = [
    Column("handoff p50 (ms)", "handoff_p50", 2),
    Column("handoff p99 (ms)", "handoff_p99", 2),
    Column("pairs out of order", "inversions", 0),
    Column("overlaps", "overlaps", 0),
    Column("burst (ms)", "burst_ms", 0),
    Column("server commands / update", "commands_per_update", 1),
    Column("round trips / update", "round_trips", 1, median_only=True),
    Column("of which in scripts", "scripted", 1, median_only=True),
]


async def _watched_burst(
    fleet: Fleet, url: str, prefix: str, variant: str, spread: int, work: float, v: int
) -> tuple[int, int]:
    """One burst under MONITOR: (commands the clients sent, commands scripts ran), of this run."""
    monitor = redis.asyncio.Redis.from_url(url)
    sent = scripted = 0
    listening = asyncio.Event()

    async def watch() -> None:
        nonlocal sent, scripted
        async with monitor.monitor() as watching:
            listening.set()
            async for entry in watching.listen():
                if prefix not in str(entry.get("command", "")):
                    continue
                if entry.get("client_type") == "lua":
                    scripted += 1
                else:
                    sent += 1

    watcher = asyncio.ensure_future(watch())
    try:
        await asyncio.wait_for(listening.wait(), 10)
        handled: dict[int, Handled] = {}
        for n in range(BURST):
            update_id = next(fleet.ids)
            handled[update_id] = Handled(update_id, n)
            fleet.send(n % spread, (TAGS[variant], _update(update_id, 20_000 + v, work)))
        fleet.reports(handled, 60.0)
        await asyncio.sleep(0.5)  # what the server did last reaches the monitor
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await monitor.aclose()
    return sent, scripted


def _headlines(rounds: Rounds) -> list[tuple[str, str]]:
    heads = Headlines()
    for spread, work in SHAPES:
        for metric, name in (("handoff_p50", "p50"), ("handoff_p99", "p99")):
            ours = rounds.spread(row(OURS, spread, work), metric)
            theirs = rounds.spread(row(THEIRS, spread, work), metric)
            if ours.count and theirs.count:
                heads.add(
                    f"aiogram burst ({spread} process{'es' if spread > 1 else ''}, "
                    f"{work * 1000:g} ms handlers): handoff {name}, RedisEventIsolation / "
                    "EventIsolation",
                    f"**{theirs.median / ours.median:.1f}x** ({fmt(theirs.median, 1)} ms vs "
                    f"{fmt(ours.median, 2)} ms)",
                )
    for variant, spread, work in ROWS:
        name = row(variant, spread, work)
        kept = sum(1 for m in rounds.data[name] if m.get("in_order") == 1.0)
        heads.add(
            f"aiogram burst in sending order: {name}", f"{kept}/{len(rounds.data[name])} rounds"
        )
    return heads.rows


def _markdown(rounds: Rounds, pairs: dict[str, tuple[Handled, Handled]], rounds_n: int) -> str:
    lines = [
        "## aiogram isolation",
        "",
        (
            f"A burst of {BURST} updates of one chat, {SPACING * 1000:g} ms apart, to one process "
            f"or alternately to {PROCESSES}; each handler works 10 or 100 ms. {rounds_n} "
            "rounds, every row in every round, on the same Redis server (a private one with "
            "`--private-server`, so the commands are the run's own). *pairs out of order*: pairs "
            "of updates handled against their sending order (0: in order; how many rounds were "
            "in order: the headlines)."
        ),
        "",
        table(rounds, COLUMNS, label="isolation"),
        "",
    ]
    if not pairs:
        lines.append(f"(The long handler, {LONG:.0f} s, is not run with `--quick`.)")
        return "\n".join(lines)
    lines += [
        (
            f"A handler of {LONG:.0f} s (aiogram's lock times out after 60 s) in process 0, the "
            "chat's next update a second later in process 1; both isolations at once:"
        ),
        "",
        (
            "| isolation | second handler started after the first (s) | ... while the first still "
            "ran, for (s) | first update's `feed_update` |"
        ),
        "|---|---|---|---|",
    ]
    for variant, (first, second) in pairs.items():
        # the second handler is short: what matters is how long before the first one's end it
        # began (the isolation was gone for that long)
        together = max(0.0, first.ended - second.started)
        lines.append(
            f"| {variant} | {second.started - first.started:.1f} | {together:.1f} | "
            f"{first.error or 'returned'} |"
        )
    return "\n".join(lines)


SCENARIO = Scenario("aiogram", run, in_all=False, own_environment=True)
