"""What an endpoint tells the platform (#14), on every backend: ``deliver``, ``dedupe_remaining``,
the ``retry_after`` estimates and ``submit`` under ``drop``.

``TestDeadWorker`` kills a spawned worker mid-handler: its redelivery is answered "in progress"
with the lease's remaining time (the issue's lost events were answered 200 "duplicate"), and the
redelivery that comes after that time is handled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from typing import TYPE_CHECKING

import pytest

from asynclock import Delivery, EventDispatcher, InboxFullError, Outcome
from asynclock.state import DedupeReading
from asynclock.state._protocol import InboxState
from tests import _dispatch_workers
from tests._dispatch_workers import event_of
from tests.conformance.test_dispatcher import (
    KEY,
    Gate,
    bot_with,
    ev,
    hold_key,
    soon,
    state_is_shared,
)

if TYPE_CHECKING:
    from asynclock import Event, State
    from asynclock._dispatch.policies import PolicyName
    from tests.conftest import Target

LEASE = 2.0


class TestDedupeRemaining:
    async def test_absent_live_and_forgotten(self, state: State) -> None:
        assert isinstance(state, DedupeReading)
        assert await state.dedupe_remaining("evt") is None
        assert await state.dedupe_add("evt", 5.0)
        remaining = await state.dedupe_remaining("evt")
        assert remaining is not None
        assert 4.0 < remaining <= 5.0
        await state.dedupe_keep("evt", 50.0)
        remaining = await state.dedupe_remaining("evt")
        assert remaining is not None
        assert 49.0 < remaining <= 50.0
        await state.dedupe_forget("evt")
        assert await state.dedupe_remaining("evt") is None

    async def test_an_expired_record_is_absent(self, state: State) -> None:
        assert isinstance(state, DedupeReading)
        assert await state.dedupe_add("evt", 0.05)
        await asyncio.sleep(0.1)
        assert await state.dedupe_remaining("evt") is None


class TestDeliver:
    async def test_handled_then_a_done_duplicate_is_acknowledged(self, state: State) -> None:
        bot = bot_with(state, lambda e: None, lock_ttl=LEASE)
        assert await bot.deliver(ev("m1")) == Delivery(Outcome.HANDLED)
        again = await bot.deliver(ev("m1"))
        assert again == Delivery(Outcome.DUPLICATE)
        assert not again.redeliver

    async def test_a_duplicate_in_progress_asks_for_a_retry_after_its_lease(
        self, state: State
    ) -> None:
        gate = Gate()
        bot = bot_with(state, gate, lock_ttl=LEASE)
        other = bot_with(state, lambda e: None, lock_ttl=LEASE)
        holder = await hold_key(bot, gate, ev("m1"))
        busy = await other.deliver(ev("m1"))
        assert busy.outcome is Outcome.DUPLICATE
        assert busy.in_progress
        assert busy.redeliver
        assert busy.retry_after is not None
        # the lease's remaining time (renewed to LEASE every LEASE/3), plus under a second of
        # jitter: never the dedupe TTL
        assert 0 < busy.retry_after <= LEASE + 0.5
        gate.open()
        assert await soon(holder) is Outcome.HANDLED
        done = await other.deliver(ev("m1"))
        assert done == Delivery(Outcome.DUPLICATE)

    async def test_a_duplicate_of_the_same_process_is_in_progress_too(self, state: State) -> None:
        gate = Gate()
        bot = bot_with(state, gate, lock_ttl=LEASE)
        holder = await hold_key(bot, gate, ev("m1"))
        busy = await bot.deliver(ev("m1"))
        assert (busy.outcome, busy.in_progress) == (Outcome.DUPLICATE, True)
        gate.open()
        await soon(holder)

    async def test_dropped_retry_after_is_an_estimate_spread_per_retry(self, state: State) -> None:
        gate = Gate()
        bot = bot_with(state, gate, lock_ttl=30.0)
        holder = await hold_key(bot, gate, ev("m1"))
        drops = [await bot.deliver(ev(f"m{n}")) for n in range(2, 6)]
        assert all(d.outcome is Outcome.DROPPED and d.redeliver for d in drops)
        waits = [d.retry_after or 0.0 for d in drops]
        assert all(1.0 <= w <= 30.0 for w in waits), waits
        # a whole second each, the first one handling (about a second) away: not the TTL
        assert all(b - a >= 0.5 for a, b in itertools.pairwise(waits)), waits
        assert waits[0] <= 2.5
        gate.open()
        await soon(holder)

    async def test_two_workers_never_promise_the_same_second(
        self, state: State, peer_state: State
    ) -> None:
        gate = Gate()
        bot = bot_with(state, gate, lock_ttl=30.0)
        peer = bot_with(peer_state, gate, lock_ttl=30.0)
        holder = await hold_key(bot, gate, ev("m1"))
        seconds = []
        for n in range(2, 10):
            answered = await (bot if n % 2 else peer).deliver(ev(f"m{n}"))
            assert answered.outcome is Outcome.DROPPED
            assert answered.retry_after is not None
            seconds.append(round(time.time() + answered.retry_after))
        if state_is_shared(state):  # the slots are claimed in the state both workers share
            assert len(set(seconds)) == len(seconds), seconds
        gate.open()
        await soon(holder)

    async def test_a_holder_that_stopped_renewing_is_waited_out(self, state: State) -> None:
        # a dead worker's lock: 4 s left of its TTL and nobody renews it (a live holder of a
        # 10 s lock renews every 3.3 s). Retrying before it lapses would only be dropped again
        await state.acquire(KEY, "a-dead-worker", 4.0)
        bot = bot_with(state, lambda e: None, lock_ttl=10.0)
        dropped = await bot.deliver(ev("m1"))
        assert dropped.outcome is Outcome.DROPPED
        assert dropped.retry_after is not None
        # the lapse, plus up to half a second of jitter, rounded up to a whole second
        assert 3.0 <= dropped.retry_after <= 4.0 + 0.5 + 1.0, dropped

    async def test_failed_asks_for_a_redelivery_on_the_platforms_schedule(
        self, state: State
    ) -> None:
        def broken(event: Event) -> None:
            raise RuntimeError("boom")

        bot = bot_with(state, broken, raise_errors=False)
        failed = await bot.deliver(ev("m1"))
        assert failed == Delivery(Outcome.FAILED)
        assert failed.redeliver


class TestSubmitNeverDropsAfterTheAnswer:
    async def test_submit_under_drop_is_refused(self, state: State) -> None:
        bot = bot_with(state, lambda e: None)
        with pytest.raises(ValueError, match="on_lock_conflict='drop'"):
            bot.submit(ev("m1"))
        await bot.aclose()
        assert sum(bot.stats.values()) == 0

    async def test_a_policy_function_choosing_drop_queues_a_submitted_event(
        self, state: State, caplog: pytest.LogCaptureFixture
    ) -> None:
        def always_drop(key: str, event: Event) -> PolicyName:
            return "drop"

        gate = Gate()
        bot = bot_with(state, gate, on_lock_conflict=always_drop)
        holder = await hold_key(bot, gate, ev("m1"))
        with caplog.at_level(logging.WARNING, logger="asynclock"):
            task = bot.submit(ev("m2"))
            await asyncio.sleep(0.05)
            assert not task.done()
            gate.open()
            assert await soon(holder) is Outcome.HANDLED
            assert await soon(task) is Outcome.QUEUED
        assert "queued instead" in caplog.text
        # dispatch() (answered with the outcome) still drops
        gate.close()
        holder = await hold_key(bot, gate, ev("m3"))
        assert await bot.dispatch(ev("m4")) is Outcome.DROPPED
        gate.open()
        await soon(holder)
        await bot.aclose()


class TestInboxFullRetryAfter:
    async def test_full_inbox_estimate_is_spread_and_capped(self, state: State) -> None:
        bot = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=30.0, max_pending=1)
        assert isinstance(state, InboxState)  # every built-in state has the inbox
        assert await bot.accept(ev("m1")) is Outcome.ACCEPTED
        waits = []
        for n in range(2, 5):
            with pytest.raises(InboxFullError) as caught:
                await bot.accept(ev(f"m{n}"))
            waits.append(caught.value.retry_after)
        assert 1.0 <= waits[0] < 2.0, waits
        assert all(b - a >= 0.5 for a, b in itertools.pairwise(waits)), waits


@pytest.mark.processes
class TestDeadWorker:
    LOCK_TTL = 1.0
    #: a spawned interpreter importing asynclock and a driver is slow on a loaded machine
    SPAWN_BOUND = 30.0

    async def test_a_dead_workers_event_is_in_progress_then_handled_after_retry_after(
        self, server_target: Target, server_state: State
    ) -> None:
        spec = ("K", "K-m1")
        await _dispatch_workers.kill_mid_dispatch(
            server_target.url, server_target.options, spec, self.LOCK_TTL, self.SPAWN_BOUND
        )
        handled: list[str | None] = []
        bot = EventDispatcher(server_state, lock_ttl=self.LOCK_TTL, dedupe_ttl=600.0)
        bot.add_handler("*", lambda event: handled.append(event.message_id))
        answered = await bot.deliver(event_of(spec))
        # the platform is told to come back, not that the event is done
        assert answered.outcome is Outcome.DUPLICATE
        assert answered.in_progress
        assert answered.redeliver
        assert answered.retry_after is not None
        assert answered.retry_after <= self.LOCK_TTL + 0.5
        retries: list[Outcome] = []
        while answered.redeliver and len(retries) < 3:  # a platform's three retries
            assert answered.retry_after is not None
            assert answered.retry_after <= self.LOCK_TTL + 0.5  # never the dedupe TTL
            await asyncio.sleep(answered.retry_after)  # the platform honours Retry-After
            answered = await bot.deliver(event_of(spec))
            retries.append(answered.outcome)
        # the first retry after the lease's lapse runs it (or, should the dead worker's lock
        # outlive its claim by a moment, the one after)
        assert answered == Delivery(Outcome.HANDLED), retries
        assert len(retries) <= 2, retries
        assert handled == ["K-m1"]
        assert await bot.deliver(event_of(spec)) == Delivery(Outcome.DUPLICATE)
