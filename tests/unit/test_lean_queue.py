"""The dispatcher's lean queued path on MemoryState (``_dispatch/fast_route.py``: events of a key busy in this
loop wait in its line without an AsyncLock, under ``on_lock_conflict="queue"``)."""

from __future__ import annotations

import asyncio
from typing import Any

from asynclock import Event, EventDispatcher, MemoryState, Outcome
from asynclock import metrics as asynclock_metrics
from asynclock._dedupe.claim import EventClaim
from asynclock._dispatch.lean_hold import LeanHold
from asynclock._lock.engine import line_for

KEY = "slack:C1:T1"


def ev(message_id: str) -> Event:
    return Event(
        type="mention", adapter="slack", channel_id="C1", thread_id="T1", message_id=message_id
    )


class Bot:
    """A queue-policy dispatcher whose handler records the order and waits on a gate."""

    def __init__(self, state: MemoryState, *, lock_ttl: float = 30.0, hold: float = 0.0) -> None:
        self.state = state
        self.dispatcher = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=lock_ttl)
        self.gate = asyncio.Event()
        self.seen: list[str] = []
        self.inside = 0
        self.most_inside = 0
        self.hold = hold
        self.dispatcher.add_handler("mention", self._handle)

    async def _handle(self, event: Event) -> None:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        self.seen.append(event.message_id or "")
        try:
            if event.message_id == "h":
                await self.gate.wait()
            if self.hold:
                await asyncio.sleep(self.hold)
            await asyncio.sleep(0)
        finally:
            self.inside -= 1

    async def start(self, *ids: str) -> list[asyncio.Task[Outcome]]:
        """Dispatch ``ids`` in this order; returns once each has taken its place."""
        tasks = [asyncio.create_task(self.dispatcher.dispatch(ev(i))) for i in ids]
        for _ in range(3):
            await asyncio.sleep(0)
        return tasks

    def waiting(self) -> list[object]:
        return list(line_for(self.state, KEY).waiters)


async def test_queued_events_wait_lean_and_run_in_arrival_order() -> None:
    async with MemoryState() as state:
        bot = Bot(state)
        holder, *queued = await bot.start("h", *(f"w{n}" for n in range(30)))
        waiting = bot.waiting()
        assert len(waiting) == 30
        assert all(type(w) is LeanHold for w in waiting)  # the lean path, no AsyncLock
        bot.gate.set()
        assert await holder is Outcome.HANDLED
        assert await asyncio.gather(*queued) == [Outcome.QUEUED] * 30
        assert bot.seen == ["h", *(f"w{n}" for n in range(30))]
        assert bot.most_inside == 1
        assert bot.dispatcher.stats[Outcome.QUEUED] == 30
        assert bot.dispatcher.stats[Outcome.HANDLED] == 1
        assert await state.inspect(KEY) is None
        # every claim was taken and marked done: redeliveries are duplicates
        again = await asyncio.gather(*(bot.dispatcher.dispatch(ev(f"w{n}")) for n in range(30)))
        assert again == [Outcome.DUPLICATE] * 30


async def test_a_cancelled_queued_event_leaves_its_place_and_is_not_claimed() -> None:
    async with MemoryState() as state:
        bot = Bot(state)
        holder, first, middle, last = await bot.start("h", "a", "b", "c")
        assert all(type(w) is LeanHold for w in bot.waiting())
        middle.cancel()
        await asyncio.gather(middle, return_exceptions=True)
        assert middle.cancelled()
        assert len(bot.waiting()) == 2
        bot.gate.set()
        assert list(await asyncio.gather(holder, first, last)) == [
            Outcome.HANDLED,
            Outcome.QUEUED,
            Outcome.QUEUED,
        ]
        assert bot.seen == ["h", "a", "c"]
        assert await state.inspect(KEY) is None
        assert await bot.dispatcher.dispatch(ev("b")) is Outcome.HANDLED  # nothing recorded


class _CancelOnRelease:
    """A metrics sink that cancels a task right after the lock's release handed it over."""

    def __init__(self) -> None:
        self.victim: asyncio.Task[Outcome] | None = None

    def lock_released(self, key: str, held: float) -> None:
        if self.victim is not None:
            self.victim.cancel()
            self.victim = None

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


async def test_cancelled_just_after_the_handover_passes_the_lock_on() -> None:
    sink = _CancelOnRelease()
    previous = asynclock_metrics.set_metrics(sink)
    try:
        async with MemoryState() as state:
            bot = Bot(state)
            holder, victim, after = await bot.start("h", "v", "x")
            sink.victim = victim  # cancelled once h's release handed it the lock
            bot.gate.set()
            assert await holder is Outcome.HANDLED
            await asyncio.gather(victim, return_exceptions=True)
            assert victim.cancelled()
            assert await asyncio.wait_for(after, 5) is Outcome.QUEUED
            assert bot.seen == ["h", "x"]
            assert await state.inspect(KEY) is None
            assert await bot.dispatcher.dispatch(ev("v")) is Outcome.HANDLED
    finally:
        asynclock_metrics.set_metrics(previous)


async def test_a_duplicate_arriving_while_queued_is_answered_at_once() -> None:
    async with MemoryState() as state:
        bot = Bot(state)
        holder, queued = await bot.start("h", "q")
        assert await asyncio.wait_for(bot.dispatcher.dispatch(ev("q")), 5) is Outcome.DUPLICATE
        assert not queued.done()
        bot.gate.set()
        assert list(await asyncio.gather(holder, queued)) == [Outcome.HANDLED, Outcome.QUEUED]
        assert bot.seen == ["h", "q"]


async def test_a_claim_recorded_elsewhere_makes_a_queued_event_a_duplicate_at_once() -> None:
    async with MemoryState() as state:
        bot = Bot(state)
        (holder,) = await bot.start("h")
        claim = EventClaim.of(ev("t"), KEY)
        assert claim is not None
        assert await state.dedupe_add(claim.key, 60.0)  # as a delivery in another loop would
        taken, after = await bot.start("t", "z")
        assert await asyncio.wait_for(taken, 5) is Outcome.DUPLICATE  # not after the holder
        assert not holder.done()
        assert [type(w) for w in bot.waiting()] == [LeanHold]
        bot.gate.set()
        assert list(await asyncio.wait_for(asyncio.gather(holder, after), 5)) == [
            Outcome.HANDLED,
            Outcome.QUEUED,
        ]
        assert bot.seen == ["h", "z"]
        assert await state.inspect(KEY) is None


async def test_a_queued_event_keeps_its_claim_leased_while_it_waits() -> None:
    async with MemoryState() as state:
        bot = Bot(state, lock_ttl=0.3)
        holder, queued = await bot.start("h", "q")
        claim = EventClaim.of(ev("q"), KEY)
        assert claim is not None
        await asyncio.sleep(0.75)  # two and a half leases
        assert await state.dedupe_remaining(claim.key) is not None
        other = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=0.3)
        assert await other.dispatch(ev("q")) is Outcome.DUPLICATE
        bot.gate.set()
        assert list(await asyncio.gather(holder, queued)) == [Outcome.HANDLED, Outcome.QUEUED]
        remaining = await state.dedupe_remaining(claim.key)
        assert remaining is not None
        assert remaining > 1.0  # marked done (the dedupe TTL), not a lease
        assert bot.seen == ["h", "q"]


async def test_a_handler_outliving_a_third_of_the_ttl_keeps_the_lock_while_others_queue() -> None:
    async with MemoryState() as state:
        bot = Bot(state, lock_ttl=0.3, hold=0.0)
        holder, *queued = await bot.start("h", "a", "b")
        await asyncio.sleep(0.5)  # past the TTL itself: only renewal keeps the holder's lock
        held = await state.inspect(KEY)
        assert held is not None
        assert bot.seen == ["h"]
        assert len(bot.waiting()) == 2
        claim = EventClaim.of(ev("h"), KEY)
        assert claim is not None
        assert await state.dedupe_remaining(claim.key) is not None  # its lease renewed too
        bot.gate.set()
        assert await asyncio.gather(holder, *queued) == [Outcome.HANDLED, *[Outcome.QUEUED] * 2]
        assert bot.seen == ["h", "a", "b"]
        assert bot.most_inside == 1
        assert await state.inspect(KEY) is None


async def test_a_queued_event_whose_handler_is_long_is_renewed_too() -> None:
    async with MemoryState() as state:
        bot = Bot(state, lock_ttl=0.3, hold=0.45)
        outcomes = await asyncio.wait_for(
            asyncio.gather(*(bot.dispatcher.dispatch(ev(i)) for i in ("a", "b", "c"))), 10
        )
        assert outcomes == [Outcome.HANDLED, Outcome.QUEUED, Outcome.QUEUED]
        assert bot.seen == ["a", "b", "c"]
        assert bot.most_inside == 1
        assert await state.inspect(KEY) is None


async def test_a_patched_state_keeps_the_general_path() -> None:
    class Spied(MemoryState):
        async def release(
            self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
        ) -> Any:
            return await super().release(key, owner, successor=successor, ttl=ttl)

    async with Spied() as state:
        bot = Bot(state)
        holder, queued = await bot.start("h", "q")
        assert not any(type(w) is LeanHold for w in bot.waiting())
        bot.gate.set()
        assert list(await asyncio.gather(holder, queued)) == [Outcome.HANDLED, Outcome.QUEUED]


async def test_a_queued_event_promoted_after_the_holder_lost_its_lock_contends_and_runs() -> None:
    async with MemoryState() as state:
        bot = Bot(state)
        holder, queued = await bot.start("h", "q")
        assert [type(w) for w in bot.waiting()] == [LeanHold]
        assert await state.force_release(KEY) is not None  # an operator frees the key
        bot.gate.set()
        # h's handlers returned: it stays handled though its release found the lock gone; q was
        # promoted to contend (nothing handed over) and takes the lock on the general path
        assert list(await asyncio.wait_for(asyncio.gather(holder, queued), 5)) == [
            Outcome.HANDLED,
            Outcome.QUEUED,
        ]
        assert bot.seen == ["h", "q"]
        assert await state.inspect(KEY) is None
        assert await bot.dispatcher.dispatch(ev("q")) is Outcome.DUPLICATE


async def test_a_cancellation_requested_before_the_dispatch_lands_before_the_claim() -> None:
    # The lean path acts before its first suspension; a cancellation the task already asked
    # for must still land first: no handler starts, no claim is left to make the
    # redelivery a duplicate.
    state = MemoryState()
    bot = Bot(state)

    async def cancelled_then_dispatch() -> Outcome:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        return await bot.dispatcher.dispatch(ev("m1"))

    attempt = asyncio.create_task(cancelled_then_dispatch())
    await asyncio.wait((attempt,))
    assert attempt.cancelled()
    assert bot.seen == []
    assert await bot.dispatcher.dispatch(ev("m1")) is Outcome.HANDLED
    assert bot.seen == ["m1"]
