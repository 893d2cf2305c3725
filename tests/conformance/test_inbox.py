"""The durable inbox (SPEC section 6): ``accept`` stores, ``serve`` drains in order, nothing lost.

Runs on every backend that has the inbox (``INBOX_STATES``); the others must refuse it with a
clear error. Two dispatchers on two clients of one namespace stand in for two worker processes
here; ``test_inbox_processes.py`` does it with real processes and ``kill -9``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections import Counter, defaultdict
from typing import TYPE_CHECKING

import pytest

from asynclock import (
    Event,
    EventDispatcher,
    HandlerContext,
    InboxFullError,
    Outcome,
    state_from_url,
)
from asynclock.state import MemoryState
from asynclock.state._protocol import InboxState
from tests._matrix import INBOX_STATES, Backend, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from typing_extensions import Self

    from asynclock import State

SOON = 10.0


def ev(n: int | str, *, thread: str = "T1", raw: dict[str, object] | None = None) -> Event:
    return Event("message", "slack", "C1", thread, f"m{n}", raw if raw is not None else {})


async def until(predicate: Callable[[], bool], what: str, within: float = SOON) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {within} s for: {what}")
        await asyncio.sleep(0.005)


class Namespace:
    """One test's namespace on one backend, and new clients of it (as other workers have)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.namespace = uuid.uuid4().hex
        self.memory: State | None = None

    def open(self) -> State:
        if not self.backend.server:  # a MemoryState is its own namespace: one object
            if self.memory is None:
                self.memory = state_from_url("memory://")
            return self.memory
        return state_from_url(self.backend.url, **self.backend.options(self.namespace))


@pytest.fixture(params=INBOX_STATES)
async def space(request: pytest.FixtureRequest) -> AsyncIterator[Namespace]:
    backend: Backend = request.param
    require(backend)
    made = Namespace(backend)
    yield made
    await purge_namespace(backend, made.namespace)


@pytest.fixture
async def state(space: Namespace) -> AsyncIterator[State]:
    opened = space.open()
    yield opened
    await opened.aclose()


class Recorder:
    """A handler that records (message id, attempt, token) per lock key, and overlaps."""

    def __init__(self, pause: float = 0.0) -> None:
        self.calls: list[tuple[str, str | None, int]] = []
        self.per_key: defaultdict[str, list[str | None]] = defaultdict(list)
        self.inside: Counter[str] = Counter()
        self.overlaps = 0
        self.pause = pause
        self.tokens: defaultdict[str, list[int]] = defaultdict(list)

    async def __call__(self, event: Event, ctx: HandlerContext) -> None:
        self.inside[ctx.lock_key] += 1
        if self.inside[ctx.lock_key] > 1:
            self.overlaps += 1
        try:
            self.calls.append((ctx.lock_key, event.message_id, ctx.attempt))
            self.per_key[ctx.lock_key].append(event.message_id)
            if ctx.token is not None:
                self.tokens[ctx.lock_key].append(ctx.token)
            await asyncio.sleep(self.pause)
        finally:
            self.inside[ctx.lock_key] -= 1


def bot_on(state: State, handler: object, **options: object) -> EventDispatcher:
    bot = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=5.0, **options)  # type: ignore[arg-type]
    bot.add_handler("*", handler)  # type: ignore[arg-type]
    return bot


async def serving(bot: EventDispatcher) -> asyncio.Task[None]:
    task = asyncio.create_task(bot.serve())
    await asyncio.sleep(0)
    return task


async def stop(bot: EventDispatcher, task: asyncio.Task[None]) -> None:
    await bot.aclose()
    await asyncio.wait_for(task, SOON)


class TestAccept:
    async def test_accept_stores_and_never_runs_the_handler(self, state: State) -> None:
        recorder = Recorder()
        bot = bot_on(state, recorder)
        assert await bot.accept(ev(1)) is Outcome.ACCEPTED
        assert await bot.accept(ev(2)) is Outcome.ACCEPTED
        assert recorder.calls == []
        assert isinstance(state, InboxState)
        assert await state.inbox_ready() == ["slack:C1:T1"]
        [info] = await state.inbox_keys()
        assert (info.key, info.pending, info.dead) == ("slack:C1:T1", 2, 0)
        assert bot.stats[Outcome.ACCEPTED] == 2

    async def test_a_redelivery_is_a_duplicate_before_and_after_handling(
        self, state: State
    ) -> None:
        recorder = Recorder()
        bot = bot_on(state, recorder)
        assert await bot.accept(ev(1)) is Outcome.ACCEPTED
        assert await bot.accept(ev(1)) is Outcome.DUPLICATE
        task = await serving(bot)
        await until(lambda: len(recorder.calls) == 1, "m1 handled")
        assert await bot.accept(ev(1)) is Outcome.DUPLICATE
        # and a dispatch of the same event is a duplicate too: one dedupe record
        assert await bot.dispatch(ev(1)) is Outcome.DUPLICATE
        await stop(bot, task)
        assert [m for _, m, _ in recorder.calls] == ["m1"]

    async def test_raw_must_be_json(self, state: State) -> None:
        bot = bot_on(state, Recorder())
        with pytest.raises(TypeError, match=r"Event.raw\['when'\]"):
            await bot.accept(ev(1, raw={"when": object()}))
        assert await state.inbox_ready() == []  # type: ignore[attr-defined]

    async def test_a_full_inbox_refuses_and_keeps_what_it_has(self, state: State) -> None:
        recorder = Recorder()
        bot = bot_on(state, recorder, max_pending=3)
        for n in range(3):
            assert await bot.accept(ev(n)) is Outcome.ACCEPTED
        with pytest.raises(InboxFullError) as caught:
            await bot.accept(ev(3))
        assert caught.value.key == "slack:C1:T1"
        assert 0 < caught.value.retry_after <= 5.0
        # another key has room of its own
        assert await bot.accept(ev(9, thread="T2")) is Outcome.ACCEPTED
        task = await serving(bot)
        await until(lambda: len(recorder.calls) == 4, "everything accepted handled")
        # the refused event was not recorded as seen: its redelivery is accepted now
        assert await bot.accept(ev(3)) is Outcome.ACCEPTED
        await until(lambda: len(recorder.calls) == 5, "the redelivery handled")
        await stop(bot, task)
        assert recorder.per_key["slack:C1:T1"] == ["m0", "m1", "m2", "m3"]

    async def test_bad_options(self, state: State) -> None:
        with pytest.raises(ValueError, match="max_attempts"):
            EventDispatcher(state, max_attempts=0)
        with pytest.raises(TypeError, match="max_pending"):
            EventDispatcher(state, max_pending=1.5)  # type: ignore[arg-type]


class TestServe:
    async def test_each_key_in_accept_order_and_keys_in_parallel(self, state: State) -> None:
        recorder = Recorder(pause=0.01)
        bot = bot_on(state, recorder)
        for n in range(30):
            await bot.accept(ev(n, thread=f"T{n % 3}"))
        started = time.monotonic()
        task = await serving(bot)
        await until(lambda: len(recorder.calls) == 30, "all 30 handled")
        elapsed = time.monotonic() - started
        await stop(bot, task)
        for t in range(3):
            assert recorder.per_key[f"slack:C1:T{t}"] == [f"m{n}" for n in range(t, 30, 3)]
        assert recorder.overlaps == 0
        assert all(attempt == 1 for _, _, attempt in recorder.calls)
        assert elapsed < 30 * 0.01 * 0.9, f"keys were not drained in parallel ({elapsed:.2f} s)"
        assert await state.inbox_ready() == []  # type: ignore[attr-defined]
        for t in range(3):  # release-if-empty freed every key
            assert await state.inspect(f"slack:C1:T{t}") is None

    async def test_nothing_accepted_during_a_drain_is_stranded(self, state: State) -> None:
        # Entries arrive while drainers finish and release: every one is handled, because the
        # last step releases only an empty inbox, atomically.
        recorder = Recorder()
        bot = bot_on(state, recorder)
        task = await serving(bot)
        expected: Counter[str] = Counter()
        for n in range(200):
            thread = f"T{n % 5}"
            await bot.accept(ev(n, thread=thread))
            expected[f"slack:C1:{thread}"] += 1
            if n % 7 == 0:
                await asyncio.sleep(0.001)
        await until(lambda: len(recorder.calls) == 200, "all 200 handled", within=30.0)
        await stop(bot, task)
        assert Counter(k for k, _, _ in recorder.calls) == expected
        for key, ids in recorder.per_key.items():
            numbers = [int((m or "m0")[1:]) for m in ids]
            assert numbers == sorted(numbers), key
        assert recorder.overlaps == 0

    async def test_an_accept_as_its_key_is_released_is_drained_at_once(self, state: State) -> None:
        # Each event is accepted the moment the previous one's handler starts, so it often lands
        # right after the drainer's last step released the key on an empty inbox, before that
        # drainer's task has ended: the scan its wake-up triggers still sees the key taken. The
        # end of that task must trigger a new scan; without it the event waited for the next
        # rescan (lock_ttl / 2 = 2.5 s here), about 1 event in 250 on Redis.
        started = asyncio.Event()

        async def handler(event: Event) -> None:
            started.set()

        bot = bot_on(state, handler)
        task = await serving(bot)
        waits = []
        for n in range(1000):
            started.clear()
            t0 = time.monotonic()
            await bot.accept(ev(n))
            await asyncio.wait_for(started.wait(), SOON)
            waits.append(time.monotonic() - t0)
        await stop(bot, task)
        slow = [w for w in waits if w > 1.0]
        assert not slow, f"{len(slow)} of 1000 events waited for a rescan, up to {max(slow):.1f} s"

    async def test_fencing_tokens_grow_per_key(self, state: State) -> None:
        recorder = Recorder()
        bot = bot_on(state, recorder)
        task = await serving(bot)
        for n in range(10):
            await bot.accept(ev(n))
            await asyncio.sleep(0.002)
        await until(lambda: len(recorder.calls) == 10, "all handled")
        await stop(bot, task)
        tokens = recorder.tokens["slack:C1:T1"]
        assert all(a <= b for a, b in itertools.pairwise(tokens)), tokens

    async def test_two_workers_share_the_inbox(self, space: Namespace) -> None:
        states = [space.open(), space.open()]
        recorder = Recorder(pause=0.002)  # one recorder: overlaps across the two "workers" count
        bots = [bot_on(s, recorder) for s in states]
        tasks = [await serving(b) for b in bots]
        for n in range(120):
            await bots[n % 2].accept(ev(n, thread=f"T{n % 4}"))
        await until(lambda: len(recorder.calls) == 120, "all 120 handled", within=30.0)
        for bot, task in zip(bots, tasks, strict=True):
            await stop(bot, task)
        for s in set(map(id, states)):
            await next(x for x in states if id(x) == s).aclose()
        assert recorder.overlaps == 0
        assert sorted(m or "" for _, m, _ in recorder.calls) == sorted(f"m{n}" for n in range(120))
        for t in range(4):
            assert recorder.per_key[f"slack:C1:T{t}"] == [f"m{n}" for n in range(t, 120, 4)]

    async def test_a_worker_that_starts_later_finds_the_backlog(self, state: State) -> None:
        recorder = Recorder()
        producer = bot_on(state, recorder)
        for n in range(5):
            await producer.accept(ev(n, thread=f"T{n}"))
        worker = bot_on(state, recorder)
        task = await serving(worker)
        await until(lambda: len(recorder.calls) == 5, "the backlog handled")
        await stop(worker, task)


class TestFailures:
    async def test_retried_then_dead_lettered_and_the_key_goes_on(
        self, state: State, caplog: pytest.LogCaptureFixture
    ) -> None:
        recorder = Recorder()

        async def handler(event: Event, ctx: HandlerContext) -> None:
            await recorder(event, ctx)
            if event.message_id == "m1":
                raise RuntimeError("poison pill")

        bot = bot_on(state, handler, max_attempts=3, raise_errors=False)
        for n in range(3):
            await bot.accept(ev(n))
        with caplog.at_level(logging.ERROR, logger="asynclock"):
            task = await serving(bot)
            await until(lambda: len(recorder.calls) == 5, "m0, m1 three times, m2")
            await stop(bot, task)
        assert recorder.calls == [
            ("slack:C1:T1", "m0", 1),
            ("slack:C1:T1", "m1", 1),
            ("slack:C1:T1", "m1", 2),
            ("slack:C1:T1", "m1", 3),
            ("slack:C1:T1", "m2", 1),
        ]
        assert bot.stats[Outcome.FAILED] == 3
        assert bot.stats[Outcome.HANDLED] == 2
        dead_logs = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
        assert len(dead_logs) == 1
        assert getattr(dead_logs[0], "message_id") == "m1"  # noqa: B009 - a logging extra
        assert isinstance(state, InboxState)
        [letter] = await state.inbox_dead_letters("slack:C1:T1")
        assert (letter.attempts, letter.error) == (3, "RuntimeError: poison pill")
        assert '"message_id":"m1"' in letter.payload
        [info] = await state.inbox_keys()
        assert (info.pending, info.dead) == (0, 1)

    async def test_requeue_puts_dead_letters_back_in_order(self, state: State) -> None:
        recorder = Recorder()
        poisoned = {"m1", "m2"}

        async def handler(event: Event, ctx: HandlerContext) -> None:
            await recorder(event, ctx)
            if event.message_id in poisoned:
                raise RuntimeError("not yet")

        bot = bot_on(state, handler, max_attempts=1, raise_errors=False)
        for n in range(4):
            await bot.accept(ev(n))
        task = await serving(bot)
        await until(lambda: len(recorder.calls) == 4, "one pass")
        assert isinstance(state, InboxState)
        assert [d.id for d in await state.inbox_dead_letters("slack:C1:T1")] == [2, 3]
        poisoned.clear()  # fixed: the requeued letters now go through, in their order
        assert await state.inbox_requeue("slack:C1:T1") == 2
        await until(lambda: len(recorder.calls) == 6, "the requeued two")
        await stop(bot, task)
        assert [m for _, m, _ in recorder.calls[4:]] == ["m1", "m2"]
        assert await state.inbox_dead_letters("slack:C1:T1") == []
        assert await state.inbox_requeue("slack:C1:T1") == 0

    async def test_a_stale_drainer_cannot_ack(self, state: State) -> None:
        # Fenced by the lock: a step by an owner that does not hold the key changes nothing.
        from asynclock import AsyncLock, LockNotOwnedError

        bot = bot_on(state, Recorder())
        await bot.accept(ev(1))
        assert isinstance(state, InboxState)
        with pytest.raises(LockNotOwnedError):
            await state.inbox_step("slack:C1:T1", "someone", done=1)
        lock = AsyncLock(state, "slack:C1:T1", ttl=5.0)
        await lock.acquire()
        entry = await state.inbox_step("slack:C1:T1", lock.owner)
        assert entry is not None
        assert entry.attempt == 1
        with pytest.raises(LockNotOwnedError):
            await state.inbox_step("slack:C1:T1", "someone", done=entry.id)
        again = await state.inbox_step("slack:C1:T1", lock.owner)  # not acked: same entry
        assert again is not None
        assert (again.id, again.attempt) == (entry.id, 2)
        assert await state.inbox_step("slack:C1:T1", lock.owner, done=entry.id) is None
        assert await state.inspect("slack:C1:T1") is None  # released with the last step

    async def test_serve_refuses_folding_policies_for_now(self, state: State) -> None:
        bot = EventDispatcher(state, on_lock_conflict="latest")
        with pytest.raises(NotImplementedError, match="queue"):
            await bot.serve()


class LocksOnly:
    """A third-party state with the State protocol and nothing else (every built-in state now
    has the inbox): the dispatcher must refuse the inbox on it, naming what is missing."""

    def __init__(self) -> None:
        self._inner = MemoryState()
        self.acquire = self._inner.acquire
        self.release = self._inner.release
        self.abandon = self._inner.abandon
        self.extend = self._inner.extend
        self.inspect = self._inner.inspect
        self.dedupe_add = self._inner.dedupe_add
        self.dedupe_keep = self._inner.dedupe_keep
        self.dedupe_forget = self._inner.dedupe_forget
        self.watch = self._inner.watch
        self.aclose = self._inner.aclose

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def test_a_state_without_the_inbox_says_so() -> None:
    state = LocksOnly()
    assert not isinstance(state, InboxState)
    bot = EventDispatcher(state, on_lock_conflict="queue")
    with pytest.raises((TypeError, NotImplementedError), match="inbox"):
        await bot.accept(ev(1))
    with pytest.raises((TypeError, NotImplementedError), match="inbox"):
        await bot.serve()
    await bot.aclose()


class TestInboxMetrics:
    async def test_pending_lag_and_dead_letters_reach_every_adapter(self, state: State) -> None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from prometheus_client import CollectorRegistry

        from asynclock.metrics import set_metrics
        from asynclock.metrics.otel import OpenTelemetryMetrics
        from asynclock.metrics.prometheus import PrometheusMetrics

        class Both:
            """Forwards every report to a Prometheus and an OpenTelemetry adapter, and keeps it."""

            def __init__(self, *sinks: object) -> None:
                self.sinks = sinks
                self.entries: list[tuple[str, int, float]] = []
                self.dead: list[str] = []

            def __getattr__(self, name: str) -> Callable[..., None]:
                def forward(*args: object) -> None:
                    if name == "inbox_entry":
                        self.entries.append(args)  # type: ignore[arg-type]
                    if name == "inbox_dead_letter":
                        self.dead.append(str(args[0]))
                    for sink in self.sinks:
                        getattr(sink, name)(*args)

                return forward

        registry = CollectorRegistry()
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])
        both = Both(PrometheusMetrics(registry), OpenTelemetryMetrics(provider.get_meter("t")))
        recorder = Recorder()

        async def handler(event: Event, ctx: HandlerContext) -> None:
            await recorder(event, ctx)
            if event.message_id == "m1":
                raise RuntimeError("poison")

        bot = bot_on(state, handler, max_attempts=1, raise_errors=False)
        for n in range(3):
            await bot.accept(ev(n))
        previous = set_metrics(both)
        try:
            task = await serving(bot)
            await until(lambda: len(recorder.calls) == 3, "all three delivered")
            await stop(bot, task)
        finally:
            set_metrics(previous)
        assert [(k, p) for k, p, _ in both.entries] == [("slack:C1:T1", n) for n in (3, 2, 1)]
        assert all(age >= 0 for _, _, age in both.entries)
        assert both.dead == ["slack:C1:T1"]
        assert (
            registry.get_sample_value("asynclock_inbox_lag_seconds_count", {"name": "slack"}) == 3
        )
        assert registry.get_sample_value("asynclock_inbox_pending", {"name": "slack"}) == 1
        assert (
            registry.get_sample_value("asynclock_inbox_dead_letters_total", {"name": "slack"}) == 1
        )
        data = reader.get_metrics_data()
        assert data is not None
        names = {
            metric.name
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
        assert {
            "asynclock.inbox.lag",
            "asynclock.inbox.pending",
            "asynclock.inbox.dead_letters",
        } <= names
        provider.shutdown()

    async def test_a_sink_without_the_inbox_methods_still_works(
        self, state: State, caplog: pytest.LogCaptureFixture
    ) -> None:
        from asynclock.metrics import set_metrics

        class Older:
            def lock_acquired(self, key: str, wait: float, contended: bool) -> None: ...
            def lock_released(self, key: str, held: float) -> None: ...
            def lock_conflict(self, key: str) -> None: ...
            def lock_renewed(self, key: str) -> None: ...
            def lock_lost(self, key: str, reason: str) -> None: ...
            def dispatch_outcome(self, event_type: str, outcome: str, duration: float) -> None: ...

        recorder = Recorder()
        bot = bot_on(state, recorder)
        await bot.accept(ev(1))
        previous = set_metrics(Older())
        try:
            with caplog.at_level(logging.ERROR, logger="asynclock"):
                task = await serving(bot)
                await until(lambda: len(recorder.calls) == 1, "delivered")
                await stop(bot, task)
        finally:
            set_metrics(previous)
        assert not [r for r in caplog.records if "metrics sink failed" in r.getMessage()]
