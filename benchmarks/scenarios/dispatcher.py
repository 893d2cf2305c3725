"""Scenario ``dispatcher``: EventDispatcher throughput and state round trips per event.

Three parts, all variants interleaved round-robin in every round:

* Memory: ``EventDispatcher(MemoryState())`` against a plain ``dict[str, asyncio.Lock]`` + ``set``
  doing the same work (the in-process ideal), and chat-sdk's ``Chat`` on its memory state.
* Redis: ``EventDispatcher(RedisState)`` against the raw floor of the round trips it needs (the
  same two EVALSHA-equivalent commands issued with redis.asyncio) and chat-sdk's ``Chat`` on
  ``RedisStateAdapter``.
* Round trips: one counting pass per Redis variant after the timed rounds; every command a
  redis-py connection sends is counted on the client, and the server's own command count
  (``INFO stats``) is read around it.

Every variant runs the same handler: it counts the call and yields once
(``await asyncio.sleep(0)``). ``serial``: one producer task per thread key, awaiting its events in
order (no same-key overlap, so nothing conflicts). ``burst``: every event dispatched at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio
from redis.asyncio.connection import AbstractConnection

from benchmarks.harness.env import (
    RELEASE_SCRIPT,
    Asynclock,
    CommandCounter,
    Config,
    _dist_version,
    _git,
    log,
    now_utc,
)
from benchmarks.harness.report import Column, Headlines, Rounds, Section, table
from benchmarks.harness.rounds import rotated
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.stats import fmt, fmt_spread

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

ADAPTER = "slack"
# connections: asynclock's RedisState.from_url default; the floor and chat-sdk get the same
POOL = 50

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

# The floor's first round trip: the dedupe claim and the lock in one script, as asynclock's
# claim_acquire does, without its fencing token, waiter flags and abandon marks.
FLOOR_CLAIM_SCRIPT = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[2]) then
    return -1
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[3]) then
    return 1
end
return 0
"""


class Variant:
    """One row: builds its own events, dispatches one, counts handler calls."""

    name = ""
    redis = False
    burst = False
    one_producer = False  # the 1-connection floor: one task, events one after another

    def __init__(self) -> None:
        self.handled = 0  # handler calls
        self.covered = 0  # events a handler saw (chat-sdk queue: the call's event + skipped)
        self.rejected = 0  # refused with an error (chat-sdk drop: LockError)

    def reset(self) -> None:
        self.handled = self.covered = self.rejected = 0

    def stranded(self) -> int:
        """Events still waiting in the contender's own queue after the run (never run)."""
        return 0

    async def handle(self) -> None:
        self.handled += 1
        self.covered += 1
        await asyncio.sleep(0)

    async def setup(self) -> None:
        pass

    def native(self, key: int, message_id: str) -> Any:
        raise NotImplementedError

    async def dispatch(self, event: Any) -> None:
        raise NotImplementedError

    def check(self, n: int) -> str | None:
        """Why this run's outcome is wrong (every variant but chat-sdk's must handle all n)."""
        if self.handled != n:
            return f"handled {self.handled} of {n} events"
        return None

    async def teardown(self) -> None:
        pass


# --- memory ---------------------------------------------------------------------------------


class Plain(Variant):
    """The in-process ideal: dedupe in a set, one asyncio.Lock per thread key, waiting in turn."""

    def __init__(self, name: str, burst: bool) -> None:
        super().__init__()
        self.name, self.burst = name, burst
        self.locks: dict[str, asyncio.Lock] = {}
        self.seen: set[str] = set()

    def native(self, key: int, message_id: str) -> Any:
        return (f"{ADAPTER}:C{key}:T{key}", f"{ADAPTER}:{message_id}")

    async def dispatch(self, event: Any) -> None:
        thread_key, dedupe_key = event
        if dedupe_key in self.seen:
            return
        self.seen.add(dedupe_key)
        lock = self.locks.get(thread_key)
        if lock is None:
            lock = self.locks[thread_key] = asyncio.Lock()
        async with lock:
            await self.handle()


class AsynclockDispatcher(Variant):
    """``EventDispatcher``: ``drop`` in serial (never triggers), ``queue`` (every event
    handled) or ``latest`` (the newest waiting event handled, the rest in ``ctx.skipped``, as
    chat-sdk's queue does) in the burst."""

    def __init__(
        self,
        name: str,
        api: Asynclock,
        make_state: Callable[[], Any],
        *,
        burst: bool,
        redis: bool,
        latest: bool = False,
    ) -> None:
        super().__init__()
        self.name, self.burst, self.redis, self.latest = name, burst, redis, latest
        self.module = api.module
        self.make_state = make_state
        self.state: Any = None
        self.bot: Any = None

    async def setup(self) -> None:
        self.state = self.make_state()
        policy = "latest" if self.latest else "queue" if self.burst else "drop"
        self.bot = self.module.EventDispatcher(self.state, on_lock_conflict=policy)

        async def handler(event: Any) -> None:
            await self.handle()

        async def folding(event: Any, ctx: Any) -> None:
            self.covered += len(ctx.skipped)
            await self.handle()

        self.bot.add_handler("mention", folding if self.latest else handler)

    def check(self, n: int) -> str | None:
        if self.latest:  # every event handled or seen in a handler's ctx.skipped
            return None if self.covered == n else f"covered {self.covered} of {n} events"
        return super().check(n)

    def native(self, key: int, message_id: str) -> Any:
        return self.module.Event(
            type="mention",
            adapter=ADAPTER,
            channel_id=f"C{key}",
            thread_id=f"T{key}",
            message_id=message_id,
        )

    async def dispatch(self, event: Any) -> None:
        await self.bot.dispatch(event)

    async def teardown(self) -> None:
        if self.bot is not None:
            await self.bot.aclose()
        if self.state is not None:
            await self.state.aclose()


class ChatSdk(Variant):
    """chat-sdk's ``Chat.handle_incoming_message`` with ``MockAdapter``, as in the research."""

    def __init__(self, name: str, sdk: Any, cfg: Config, *, burst: bool, redis: bool) -> None:
        super().__init__()
        self.name, self.burst, self.redis = name, burst, redis
        self.sdk, self.cfg = sdk, cfg
        self.client: Any = None
        self.state: Any = None
        self.chat: Any = None
        self.adapter: Any = None

    def make_state(self) -> Any:
        """The chat-sdk state adapter of this row (not connected yet)."""
        sdk = self.sdk
        if not self.redis:
            return sdk.MemoryStateAdapter()
        # bounded like the others: RedisStateAdapter(url=...) builds an unbounded pool
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            self.cfg.url, max_connections=POOL, decode_responses=True
        )
        self.client = redis.asyncio.Redis(connection_pool=pool)
        prefix = self.cfg.key("dispatcher", "chat-sdk", "burst" if self.burst else "serial")
        return sdk.RedisStateAdapter(client=self.client, key_prefix=prefix)

    async def setup(self) -> None:
        sdk = self.sdk
        self.state = self.make_state()
        await self.state.connect()
        self.adapter = sdk.MockAdapter(ADAPTER)
        config = sdk.ChatConfig(
            adapters={ADAPTER: self.adapter},
            state=self.state,
            user_name="bot",
            concurrency="queue" if self.burst else "drop",
            logger="silent",
        )
        self.chat = sdk.Chat(config)

        async def on_mention(thread: Any, message: Any, context: Any = None) -> None:
            skipped = getattr(context, "skipped", None) or ()
            self.covered += len(skipped)
            await self.handle()

        self.chat.on_mention(on_mention)

    def native(self, key: int, message_id: str) -> Any:
        return self.sdk.create_test_message(
            message_id, "@bot hi", thread_id=f"{ADAPTER}:C{key}:T{key}", is_mention=True
        )

    async def dispatch(self, event: Any) -> None:
        try:
            await self.chat.handle_incoming_message(self.adapter, event.thread_id, event)
        except self.sdk.LockError:
            self.rejected += 1

    def stranded(self) -> int:
        queues = getattr(self.state, "_queues", None)  # MemoryStateAdapter's, read after the run
        return sum(len(q) for q in queues.values()) if isinstance(queues, dict) else 0

    def check(self, n: int) -> str | None:
        if not self.burst:
            return super().check(n)
        return None  # queue under a burst: keeps the newest <= 10 per key, by design

    async def teardown(self) -> None:
        if self.state is not None:
            await self.state.disconnect()
        if self.client is not None:
            await self.client.aclose()


class Floor(Variant):
    """The round trips a fresh event needs, sent directly: claim+lock script, then release script.

    Round trip 1: EVALSHA of ``FLOOR_CLAIM_SCRIPT`` (``SET dedupe 1 NX PX`` and, if new,
    ``SET lock token NX PX``). Round trip 2: EVALSHA of the compare-and-delete release script.
    """

    redis = True

    def __init__(self, name: str, cfg: Config, *, one_connection: bool) -> None:
        super().__init__()
        self.name, self.cfg = name, cfg
        self.one_producer = one_connection
        if one_connection:
            self.client = redis.asyncio.Redis.from_url(cfg.url)
        else:
            pool = redis.asyncio.BlockingConnectionPool.from_url(cfg.url, max_connections=POOL)
            self.client = redis.asyncio.Redis(connection_pool=pool)
        self.prefix = cfg.key("dispatcher", "floor", "one" if one_connection else "pool") + ":"
        self.claim_sha = self.release_sha = ""
        self.misses = 0

    async def setup(self) -> None:
        self.claim_sha = await self.client.script_load(FLOOR_CLAIM_SCRIPT)
        self.release_sha = await self.client.script_load(RELEASE_SCRIPT)

    def native(self, key: int, message_id: str) -> Any:
        thread = f"{ADAPTER}:C{key}:T{key}"
        p = self.prefix
        return (f"{p}event:{{{thread}}}:{ADAPTER}:{message_id}", f"{p}{{{thread}}}", message_id)

    async def dispatch(self, event: Any) -> None:
        dedupe_key, lock_key, token = event
        evalsha: Any = self.client.evalsha
        claimed = await evalsha(self.claim_sha, 2, dedupe_key, lock_key, token, 600000, 30000)
        if claimed != 1:
            self.misses += 1
            return
        try:
            await self.handle()
        finally:
            await evalsha(self.release_sha, 1, lock_key, token)

    def check(self, n: int) -> str | None:
        if self.misses:
            return f"{self.misses} claims failed"
        return super().check(n)

    async def teardown(self) -> None:
        await self.client.aclose()


# --- driving --------------------------------------------------------------------------------


async def time_variant(variant: Variant, tag: str, n: int, keys: int) -> dict[str, float]:
    """One timed run of ``variant`` over ``n`` fresh events on ``keys`` keys (``tag`` keeps
    their ids fresh): throughput, wall and CPU time per event, handler calls. Raises when the
    run's outcome is wrong (``Variant.check``)."""
    per_key = _events(variant, tag, n, keys)
    variant.reset()
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    await _drive(variant, per_key)
    wrong = variant.check(n)
    if wrong:
        raise RuntimeError(wrong)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"us_event": wall / n * 1e6, "cpu_us_event": cpu / n * 1e6, **_counted(variant, n, wall)}


def _counted(variant: Variant, n: int, wall: float) -> dict[str, float]:
    """What the run did with its ``n`` events, from what actually ran: dispatch calls per
    second, handler calls (and per second), events a handler saw (its own or skipped), events
    left in the contender's queue, and the rest: dropped (fell out of a queue, or refused)."""
    stranded = variant.stranded()
    return {
        "events_s": n / wall,
        "handled_s": variant.handled / wall,
        "handled": variant.handled,
        "covered": variant.covered,
        "skipped": variant.covered - variant.handled,
        "stranded": stranded,
        "dropped": n - variant.covered - stranded,
        "rejected": variant.rejected,
    }


def _events(variant: Variant, tag: str, n: int, keys: int) -> list[list[Any]]:
    """Per thread key, its events in order; event i belongs to key ``i % keys``."""
    per_key: list[list[Any]] = [[] for _ in range(keys)]
    for i in range(n):
        per_key[i % keys].append(variant.native(i % keys, f"{tag}-{i}"))
    return per_key


def _interleaved(per_key: list[list[Any]]) -> list[Any]:
    longest = max(len(events) for events in per_key)
    return [events[i] for i in range(longest) for events in per_key if i < len(events)]


async def _drive(variant: Variant, per_key: list[list[Any]]) -> None:
    dispatch = variant.dispatch
    if variant.one_producer:
        for event in _interleaved(per_key):
            await dispatch(event)
    elif variant.burst:
        await asyncio.gather(*(dispatch(event) for event in _interleaved(per_key)))
    else:

        async def producer(events: list[Any]) -> None:
            for event in events:
                await dispatch(event)

        await asyncio.gather(*(producer(events) for events in per_key))


class SendCounter:
    """Counts every command a redis-py asyncio connection sends (one packed send = one round trip).

    Patches ``AbstractConnection.send_packed_command`` for the duration of the ``with`` block only
    (the counting pass, never a timed round). A pipeline would count once; none is used here.
    """

    def __init__(self) -> None:
        self.sends = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        original = AbstractConnection.send_packed_command
        counter = self

        async def send_packed_command(self: Any, command: Any, check_health: bool = True) -> None:
            counter.sends += 1
            await original(self, command, check_health)

        AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]
        try:
            yield
        finally:
            AbstractConnection.send_packed_command = original  # type: ignore[method-assign]


def _chat_sdk() -> Any | str:
    """A namespace of the chat-sdk names used here, or why it cannot be used."""
    try:
        chat = importlib.import_module("chat_sdk")
        types_ = importlib.import_module("chat_sdk.types")
        testing = importlib.import_module("chat_sdk.testing")
        memory = importlib.import_module("chat_sdk.state.memory")
        redis_state = importlib.import_module("chat_sdk.state.redis")
        errors = importlib.import_module("chat_sdk.errors")
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        return f"chat-sdk not importable ({type(exc).__name__}: {exc}); pip install chat-sdk"

    class Sdk:
        Chat = chat.Chat
        ChatConfig = types_.ChatConfig
        ConcurrencyConfig = types_.ConcurrencyConfig
        QueueEntry = types_.QueueEntry
        MockAdapter = testing.MockAdapter
        create_test_message = staticmethod(testing.create_test_message)
        MemoryStateAdapter = memory.MemoryStateAdapter
        RedisStateAdapter = redis_state.RedisStateAdapter
        LockError = errors.LockError

    return Sdk


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 2000 if cfg.quick else 4000
    keys = 50
    rounds_n = cfg.rounds_or(7, 3)
    mem, red = Rounds(), Rounds()
    for name in MEMORY_ROWS:
        mem.declare(name)
    for name in REDIS_ROWS:
        red.declare(name)
    sdk = _chat_sdk()
    variants: list[Variant] = [
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

    def rows(variant: Variant) -> Rounds:
        return red if variant.redis else mem

    live: list[Variant] = []
    for variant in variants:
        try:
            await variant.setup()
            tag = f"warmup-v{variants.index(variant)}"
            await _drive(variant, _events(variant, tag, min(n, 500), keys))
        except Exception as exc:  # noqa: BLE001, PERF203 (reported, never fatal)
            rows(variant).skip(variant.name, f"{type(exc).__name__}: {exc}")
            log(f"dispatcher: {_plain(variant.name)} skipped: {exc!r}")
            await _teardown(variant)
        else:
            live.append(variant)

    started = now_utc()
    for r in range(rounds_n):
        per_round: dict[str, dict[str, float]] = {}
        order = rotated(live, r)
        for variant in order:
            try:
                metrics = await time_variant(variant, f"r{r}v{variants.index(variant)}", n, keys)
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                rows(variant).skip(variant.name, f"{type(exc).__name__}: {exc}")
                log(f"dispatcher: {_plain(variant.name)} failed, dropped: {exc!r}")
                live.remove(variant)  # a variant that failed once is not run again
                continue
            per_round[variant.name] = metrics
        for name, metrics in per_round.items():
            for tag, ref in REFS.get(name, {}).items():
                if ref in per_round:
                    metrics[f"x_{tag}"] = metrics["events_s"] / per_round[ref]["events_s"]
                    handled_ref = per_round[ref]["handled_s"]
                    if handled_ref:
                        metrics[f"xh_{tag}"] = metrics["handled_s"] / handled_ref
        for variant in variants:
            if variant.name in per_round:
                rows(variant).add(variant.name, per_round[variant.name])
        summary = ", ".join(f"{_plain(k)}: {m['events_s']:,.0f}/s" for k, m in per_round.items())
        log(f"dispatcher round {r + 1}/{rounds_n}: {summary}")

    redis_live = [v for v in live if v.redis]
    trips = await _count_round_trips(cfg, redis_live, n, keys)
    for variant in live:
        await _teardown(variant)
    dirty = _git("status", "--porcelain", "--", "asynclock")
    commit = _git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")
    versions = {"chat-sdk": _dist_version("chat-sdk"), "git": commit}
    return _section(cfg, mem, red, trips, n, keys, rounds_n, started, versions)


async def _count_round_trips(cfg: Config, variants: list[Variant], n: int, keys: int) -> Rounds:
    """One more run per Redis variant, counting sends (client) and commands (server)."""
    trips = Rounds()
    for name in REDIS_ROWS:
        trips.declare(name)
    monitor = redis.asyncio.Redis.from_url(cfg.url)
    server = CommandCounter(monitor)
    sends = SendCounter()
    try:
        for index, variant in enumerate(variants):
            per_key = _events(variant, f"count-v{index}", n, keys)
            variant.reset()
            await server.start()
            before = sends.sends
            try:
                with sends.counting():
                    await _drive(variant, per_key)
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
                    await _drive(variant, again)
                metrics["trips_duplicate"] = (sends.sends - before) / count
                if variant.handled != handled:
                    trips.skip(variant.name, "a redelivered event was handled again")
            trips.add(variant.name, metrics)
            log(
                f"dispatcher round trips: {_plain(variant.name)}: {metrics['trips_event']:.2f}/event"
            )
    finally:
        await monitor.aclose()
    return trips


async def _teardown(variant: Variant) -> None:
    try:
        await variant.teardown()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"dispatcher: teardown of {_plain(variant.name)} failed: {exc!r}")


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
        Column("events/s (dispatch calls)", "events_s"),
        Column("µs per event", "us_event", 1),
        Column("client CPU µs per event", "cpu_us_event", 1),
        Column("÷ plain (throughput)", "x_plain", 2),
        Column("÷ chat-sdk (throughput)", "x_chat", 2),
        *_outcome_columns(),
    ]
    red_cols = [
        Column("events/s (dispatch calls)", "events_s"),
        Column("µs per event", "us_event", 1),
        Column("client CPU µs per event", "cpu_us_event", 1),
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
            f"tables interleaved round-robin (the starting variant rotates). The handler counts "
            f"the call and yields once (`await asyncio.sleep(0)`). **serial**: one producer task "
            f"per key awaits its events in order, so no two events of a key overlap (nothing "
            f"conflicts). **burst**: all {n:,} dispatches started at once; asynclock and the plain "
            f'baseline wait in turn per key (`on_lock_conflict="queue"`), so every event is '
            f"handled; in the *latest* rows asynclock hands each key's newest waiting event to "
            f"the handler with the others in `ctx.skipped`, as chat-sdk's `queue` does, so every "
            f"event is handled or seen skipped. Events are built before the clock starts. "
            f"Started {started} against "
            f"`{cfg.url}`, run {cfg.run_id} at asynclock git {versions['git']}; chat-sdk "
            f"{versions['chat-sdk']}."
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
            f"{keys * max(1, 200 // keys)} of them redelivered where dedupe applies). Round trips: "
            "every command a redis-py connection sent (`send_packed_command`, patched only for "
            "this pass), the pub/sub connection included. Redis commands: the server's `INFO "
            "stats` total_commands_processed delta, which also counts the commands run inside "
            "Lua scripts (and other clients' commands on a shared server)."
        ),
        "",
        table(trips, trip_cols),
        "",
        "How each row works:",
        (
            "- plain: `seen: set[str]` for dedupe, `locks: dict[str, asyncio.Lock]` per thread key, "
            "`async with locks[key]: await handler()`; what one process needs at the least."
        ),
        (
            "- asynclock: `EventDispatcher(state, on_lock_conflict=...)` with one `mention` "
            "handler, `await bot.dispatch(Event(...))` per event; `drop` (the default) in serial, "
            "where it never triggers, `queue` in the burst (`latest` in its *latest* rows, whose "
            "handler takes `(event, ctx)` to count `ctx.skipped`). `RedisState.from_url(url)` (a lean "
            f"pool of at most {POOL} connections). A fresh event is one EVALSHA of "
            "`claim_acquire` (dedupe claim in progress + lock) and one EVALSHA of `release_claimed` (release + claim done)."
        ),
        (
            "- floor: per event, EVALSHA of a 5-line script (`SET dedupe 1 NX PX 600000`, then, "
            "if new, `SET lock token NX PX 30000`), the handler, then EVALSHA of the "
            "compare-and-delete script (`GET == token` then `DEL`): the same two round trips as "
            "asynclock, with nothing around them (no fencing token, no renewal, no outcome "
            "record). *1 connection*: one task, `redis.asyncio.Redis.from_url(url)`, events one "
            "after another. *per-key producers*: the serial arrival of the other rows, on a "
            f"`BlockingConnectionPool` of {POOL}."
        ),
        (
            "- chat-sdk: `Chat(ChatConfig(adapters={'slack': MockAdapter('slack')}, state=..., "
            "concurrency=..., logger='silent'))`, an `on_mention` handler, "
            "`await chat.handle_incoming_message(adapter, thread_id, message)` with "
            "`create_test_message(..., is_mention=True)`. Its Redis client has a bounded pool of "
            f"{POOL} (`RedisStateAdapter(url=...)` would be unbounded). chat-sdk's `queue` keeps "
            "the newest <= 10 waiting messages per thread and hands the holder only the newest, "
            "with the rest in `context.skipped`; its default `on_queue_full='drop-oldest'` "
            "deletes the oldest entry silently (no log line, no error to the caller). Every "
            "outcome column is counted from what ran: *handler calls* are the handler's calls "
            "(*handled events/s*: those per second of the run, beside *events/s*, the dispatch "
            "calls per second); *skipped* are the events a handler saw only in "
            "`context.skipped`; *dropped* are the events offered and never seen by any handler "
            "(n - calls - skipped - events still queued after the run, which is 0: its drain "
            "empties the queue), *refused* the part of them its `drop` answered with "
            "`LockError`. asynclock and the plain baseline call the handler once per event."
        ),
        "- client CPU is `time.process_time()` over the timed run (the whole process).",
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


def _plain(name: str) -> str:
    return name.replace("**", "")


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
            f"{med(trips, R_ASYNCLOCK_B, 'trips_event', 2)} per event: a queued event's "
            "claim + lock try fails (1 round trip), it then waits in the process's FIFO for the "
            "key, and the previous holder's release hands the lock over inside the release "
            "script (no second acquire); the rest is subscribing to release channels. Inside "
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
            f"µs: {cpu_text} On this 2-vCPU box "
            "the client CPU, not the network, sets the rate. Against chat-sdk with the same "
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
            "in serial. The plain version is a set lookup and an uncontended `asyncio.Lock`; "
            "the dispatcher's lean path (`_dispatch/fast_route.py`) claims the event and takes the lock in one "
            "`MemoryState` step, runs the handler (whose first suspension is the dispatch's "
            "yield), releases and marks the claim done in one more, and counts the outcome; a "
            "queued event records its claim on arrival and waits on a bare future until the "
            "holder's release hands the lock over. "
            "On Memory the per-event cost is all framework: there is no round trip to hide it."
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
            "baseline, which runs every event). What bounds both burst ratios is the loop passes "
            "a dispatch needs: chat-sdk answers a call whose thread is busy after one (it appends "
            "to its queue and returns, the outcome unknown to the caller); asynclock's dispatch "
            "returns the event's outcome, so a folded event needs two (arrival, then the "
            "outcome once its batch ran) and a queued one three (arrival, the handover that "
            "starts its handler, the handler's own yield), as many as the plain baseline."
        )
    lines.append(
        "- Spread: the client and the server share 2 vCPUs with other work, so single rounds "
        "move by ±30% or more; compare the ratios (taken within one round), not absolute numbers."
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
