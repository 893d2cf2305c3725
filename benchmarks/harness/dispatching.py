"""The rows of the dispatcher scenarios: EventDispatcher, the in-process ideal, chat-sdk, the
raw Redis floor, and how a row is driven and timed.

``dispatcher`` times them in memory and on Redis, ``sql-dispatcher`` on PostgreSQL and MariaDB,
``inbox`` reuses chat-sdk's loader and its send counter: one definition for the three.
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
    Config,
    log,
    short,
)
from benchmarks.harness.report import Column
from benchmarks.harness.rounds import rotated, set_up
from benchmarks.harness.scenario import Variant

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from benchmarks.harness.report import Rounds

ADAPTER = "slack"
# connections: asynclock's RedisState.from_url default; the floor and chat-sdk get the same
POOL = 50

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


class Dispatching(Variant):
    """One row: builds its own events, dispatches one, counts handler calls."""

    redis = False
    burst = False
    one_producer = False  # the 1-connection floor: one task, events one after another

    def __init__(self) -> None:
        super().__init__()
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

    def native(self, key: int, message_id: str) -> Any:
        raise NotImplementedError

    async def dispatch(self, event: Any) -> None:
        raise NotImplementedError

    def check(self, n: int) -> str | None:
        """Why this run's outcome is wrong (every variant but chat-sdk's must handle all n)."""
        if self.handled != n:
            return f"handled {self.handled} of {n} events"
        return None


# --- memory ---------------------------------------------------------------------------------


class Plain(Dispatching):
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


class AsynclockDispatcher(Dispatching):
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


class ChatSdk(Dispatching):
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


class Floor(Dispatching):
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


async def time_variant(variant: Dispatching, tag: str, n: int, keys: int) -> dict[str, float]:
    """One timed run of ``variant`` over ``n`` fresh events on ``keys`` keys (``tag`` keeps
    their ids fresh): throughput, wall and CPU time per event, handler calls. Raises when the
    run's outcome is wrong (``Variant.check``)."""
    per_key = events(variant, tag, n, keys)
    variant.reset()
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    await drive(variant, per_key)
    wrong = variant.check(n)
    if wrong:
        raise RuntimeError(wrong)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"us_event": wall / n * 1e6, "cpu_us_event": cpu / n * 1e6, **_counted(variant, n, wall)}


def _counted(variant: Dispatching, n: int, wall: float) -> dict[str, float]:
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


def events(variant: Dispatching, tag: str, n: int, keys: int) -> list[list[Any]]:
    """Per thread key, its events in order; event i belongs to key ``i % keys``."""
    per_key: list[list[Any]] = [[] for _ in range(keys)]
    for i in range(n):
        per_key[i % keys].append(variant.native(i % keys, f"{tag}-{i}"))
    return per_key


def _interleaved(per_key: list[list[Any]]) -> list[Any]:
    longest = max(len(events) for events in per_key)
    return [events[i] for i in range(longest) for events in per_key if i < len(events)]


async def drive(variant: Dispatching, per_key: list[list[Any]]) -> None:
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


def chat_sdk() -> Any | str:
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


def rate_columns(rate: str = "events/s (dispatch calls)") -> list[Column]:
    """The timing columns of every dispatcher table (what :func:`time_variant` measures)."""
    return [
        Column(rate, "events_s"),
        Column("µs per event", "us_event", 1),
        Column("client CPU µs per event", "cpu_us_event", 1),
    ]


async def set_up_rows(
    variants: list[Dispatching],
    rows_of: Callable[[Dispatching], Rounds],
    *,
    warmup: int,
    keys: int,
    scenario: str,
) -> list[Dispatching]:
    """Set every row up and warm it with ``warmup`` events; the ones that work."""

    async def warm(index: int, variant: Dispatching) -> None:
        await drive(variant, events(variant, f"warmup-v{index}", warmup, keys))

    return await set_up(variants, rows_of, scenario, warm)


async def dispatch_rounds(
    live: list[Dispatching],
    variants: list[Dispatching],
    rows_of: Callable[[Dispatching], Rounds],
    *,
    n: int,
    keys: int,
    rounds_n: int,
    refs: dict[str, dict[str, str]],
    scenario: str,
) -> None:
    """Time every live row once a round (:func:`time_variant`), round-robin; a row that fails
    is dropped. ``refs``: per row, tag -> the row its ``x_<tag>`` (dispatch calls/s) and
    ``xh_<tag>`` (handler calls/s) ratios divide by, within the round."""
    for r in range(rounds_n):
        per_round: dict[str, dict[str, float]] = {}
        for variant in rotated(live, r):
            try:
                metrics = await time_variant(variant, f"r{r}v{variants.index(variant)}", n, keys)
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                rows_of(variant).skip(variant.name, f"{type(exc).__name__}: {exc}")
                log(f"{scenario}: {short(variant.name)} failed, dropped: {exc!r}")
                live.remove(variant)  # a variant that failed once is not run again
                continue
            per_round[variant.name] = metrics
        for name, metrics in per_round.items():
            for tag, ref in refs.get(name, {}).items():
                if ref in per_round:
                    metrics[f"x_{tag}"] = metrics["events_s"] / per_round[ref]["events_s"]
                    handled_ref = per_round[ref]["handled_s"]
                    if handled_ref:
                        metrics[f"xh_{tag}"] = metrics["handled_s"] / handled_ref
        for variant in variants:
            if variant.name in per_round:
                rows_of(variant).add(variant.name, per_round[variant.name])
        summary = ", ".join(f"{short(k)}: {m['events_s']:,.0f}/s" for k, m in per_round.items())
        log(f"{scenario} round {r + 1}/{rounds_n}: {summary}")
