"""``on_lock_conflict="supersede"`` on every backend (SPEC section 10).

The holder runs on ``state``; the newer event comes through ``peer_state`` (another connection
to the same server, as another process would have; on memory the same state, through a second
dispatcher), so the interruption travels by the state's push (:class:`SupersedeSignals`).
Arrival order is never left to a sleep: the newer event is sent once the holder's handler
signalled that it runs.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asynclock import Event, EventDispatcher, HandlerContext, MemoryState, Outcome
from asynclock._supersede.route import SupersedeRoute
from asynclock.state import SupersedeSignals

if TYPE_CHECKING:
    from asynclock import State

#: upper bound for anything that should happen "at once" (generous: a loaded CI box)
SOON = 5.0
#: the newer event reaches the holder's handler within this (a push; a poll of the waiter's
#: wait slices, one second with lock_ttl=30, would not)
PROMPT = 0.8


def ev(message_id: str, thread: str = "T1") -> Event:
    return Event("message", "slack", "C1", thread, message_id)


class Calls:
    """A handler that records each call and can be told how to behave per message id."""

    def __init__(self) -> None:
        self.started: dict[str, asyncio.Event] = {}
        self.contexts: dict[str, HandlerContext] = {}
        self.flagged_at: dict[str, float] = {}
        self.ended: dict[str, str] = {}  # message id -> "returned" | "cancelled" | "raised"
        self.ended_at: dict[str, float] = {}
        self.intervals: list[tuple[float, float, str]] = []
        self.hold: dict[str, float] = {}  # message id -> seconds it runs (default: returns at once)
        self.shielded: set[str] = set()
        self.fail: set[str] = set()

    def started_event(self, message_id: str) -> asyncio.Event:
        return self.started.setdefault(message_id, asyncio.Event())

    async def __call__(self, event: Event, ctx: HandlerContext) -> None:
        loop = asyncio.get_running_loop()
        message_id = event.message_id or ""
        began = loop.time()
        self.contexts[message_id] = ctx
        self.started_event(message_id).set()
        watcher = asyncio.ensure_future(self._note_flag(message_id, ctx))
        how = "returned"
        try:
            try:
                await asyncio.sleep(self.hold.get(message_id, 0.0))
            except asyncio.CancelledError:
                if message_id not in self.shielded:
                    raise
                await asyncio.sleep(0.2)  # a handler that goes on after being cancelled
            if message_id in self.fail:
                raise RuntimeError(f"handler failed on {message_id}")
        except asyncio.CancelledError:
            how = "cancelled"
            raise
        except Exception:
            how = "raised"
            raise
        finally:
            watcher.cancel()
            self.ended[message_id] = how
            self.ended_at[message_id] = loop.time()
            self.intervals.append((began, loop.time(), message_id))

    async def _note_flag(self, message_id: str, ctx: HandlerContext) -> None:
        await ctx.superseded.wait()
        self.flagged_at[message_id] = asyncio.get_running_loop().time()


def bots(
    state: State, peer_state: State, grace: float | None = 0.0, **options: object
) -> tuple[EventDispatcher, EventDispatcher, Calls]:
    calls = Calls()
    made = []
    for each in (state, peer_state):
        bot = EventDispatcher(
            each,
            on_lock_conflict="supersede",
            supersede_grace=grace,
            **options,  # type: ignore[arg-type]
        )
        bot.add_handler("message", calls)
        made.append(bot)
    return made[0], made[1], calls


async def bounded(awaitable: asyncio.Future[Outcome]) -> Outcome:
    return await asyncio.wait_for(awaitable, SOON)


def test_every_backend_has_the_capability(state: State) -> None:
    assert isinstance(state, SupersedeSignals)


async def test_a_lone_event_is_handled_and_never_flagged(state: State) -> None:
    bot, _, calls = bots(state, state)
    assert await bot.dispatch(ev("m1")) is Outcome.HANDLED
    assert calls.ended == {"m1": "returned"}
    assert not calls.contexts["m1"].superseded.is_set()
    assert calls.contexts["m1"].skipped == ()


async def test_the_newer_event_interrupts_promptly_and_is_handled_after(
    state: State, peer_state: State
) -> None:
    older, newer, calls = bots(state, peer_state, grace=0.0)
    calls.hold["m1"] = 60.0
    first = asyncio.ensure_future(older.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    second = asyncio.ensure_future(newer.dispatch(ev("m2")))
    assert await bounded(first) is Outcome.SUPERSEDED
    assert await bounded(second) is Outcome.QUEUED
    assert calls.flagged_at["m1"] - sent < PROMPT
    assert calls.ended["m1"] == "cancelled"  # grace 0: cancelled at once, its finally ran
    assert calls.ended["m2"] == "returned"
    assert calls.contexts["m2"].token > calls.contexts["m1"].token  # type: ignore[operator]
    assert not calls.contexts["m2"].superseded.is_set()
    # the interrupted event, from the other dispatcher, is in the newer call's view
    assert [e.message_id for e in calls.contexts["m2"].skipped] == ["m1"]
    assert older.stats[Outcome.SUPERSEDED] == 1
    assert newer.stats[Outcome.QUEUED] == 1


async def test_grace_lets_the_handler_finish_before_it_is_cancelled(
    state: State, peer_state: State
) -> None:
    grace = 0.3
    older, newer, calls = bots(state, peer_state, grace=grace)
    calls.hold["m1"] = 60.0
    first = asyncio.ensure_future(older.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(newer.dispatch(ev("m2")))
    assert await bounded(first) is Outcome.SUPERSEDED
    assert await bounded(second) is Outcome.QUEUED
    assert calls.ended["m1"] == "cancelled"
    waited = calls.ended_at["m1"] - calls.flagged_at["m1"]
    assert grace - 0.02 <= waited < grace + 1.0


async def test_grace_none_never_cancels_and_the_newer_call_waits(
    state: State, peer_state: State
) -> None:
    older, newer, calls = bots(state, peer_state, grace=None)
    calls.hold["m1"] = 0.5  # ignores the flag: runs to its end
    first = asyncio.ensure_future(older.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(newer.dispatch(ev("m2")))
    assert await bounded(first) is Outcome.SUPERSEDED
    assert await bounded(second) is Outcome.QUEUED
    assert calls.ended["m1"] == "returned"  # never cancelled
    assert "m1" in calls.flagged_at  # but told
    (_, end1, _), (start2, _, _) = sorted(calls.intervals)
    assert start2 >= end1


async def test_a_shielded_handler_never_runs_beside_the_newer_call(
    state: State, peer_state: State
) -> None:
    older, newer, calls = bots(state, peer_state, grace=0.0)
    calls.hold["m1"] = 60.0
    calls.shielded.add("m1")  # swallows the cancellation and goes on for 0.2 s
    first = asyncio.ensure_future(older.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(newer.dispatch(ev("m2")))
    assert await bounded(first) is Outcome.SUPERSEDED
    assert await bounded(second) is Outcome.QUEUED
    intervals = sorted(calls.intervals)
    assert [i[2] for i in intervals] == ["m1", "m2"]
    assert intervals[1][0] >= intervals[0][1]


async def test_the_newest_is_handled_with_the_others_skipped_in_arrival_order(
    state: State,
) -> None:
    bot, _, calls = bots(state, state, grace=None)
    calls.hold["m1"] = 0.3
    first = asyncio.ensure_future(bot.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    later = [asyncio.ensure_future(bot.dispatch(ev(f"m{n}"))) for n in (2, 3, 4)]
    outcomes = [await bounded(first), *[await bounded(task) for task in later]]
    assert outcomes == [Outcome.SUPERSEDED, Outcome.SKIPPED, Outcome.SKIPPED, Outcome.QUEUED]
    assert sorted(calls.contexts) == ["m1", "m4"]  # m2 and m3 never ran on their own
    assert [e.message_id for e in calls.contexts["m4"].skipped] == ["m1", "m2", "m3"]
    assert calls.contexts["m4"].token > calls.contexts["m1"].token  # type: ignore[operator]
    assert bot.stats[Outcome.SKIPPED] == 2


async def test_a_chain_of_interruptions_carries_every_event(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0)
    calls.hold.update({"m1": 60.0, "m2": 60.0})
    first = asyncio.ensure_future(bot.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(bot.dispatch(ev("m2")))
    await asyncio.wait_for(calls.started_event("m2").wait(), SOON)
    third = asyncio.ensure_future(bot.dispatch(ev("m3")))
    assert [await bounded(t) for t in (first, second, third)] == [
        Outcome.SUPERSEDED,
        Outcome.SUPERSEDED,
        Outcome.QUEUED,
    ]
    assert [e.message_id for e in calls.contexts["m2"].skipped] == ["m1"]
    assert [e.message_id for e in calls.contexts["m3"].skipped] == ["m1", "m2"]
    tokens = [calls.contexts[m].token for m in ("m1", "m2", "m3")]
    assert all(a < b for a, b in itertools.pairwise(tokens))  # type: ignore[operator]


async def test_a_chain_across_two_dispatchers_hands_every_event_over(
    state: State, peer_state: State
) -> None:
    """m1 runs here, m2 (there) interrupts it, m3 (here again) interrupts m2: each newer call
    has every earlier event in ``ctx.skipped``, in arrival order, whichever side it came from."""
    here, there, calls = bots(state, peer_state, grace=0.0)
    calls.hold.update({"m1": 60.0, "m2": 60.0})
    raw = {"text": "hi", "n": [1, 2]}
    first = asyncio.ensure_future(here.dispatch(Event("message", "slack", "C1", "T1", "m1", raw)))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(there.dispatch(ev("m2")))
    await asyncio.wait_for(calls.started_event("m2").wait(), SOON)
    third = asyncio.ensure_future(here.dispatch(ev("m3")))
    assert [await bounded(t) for t in (first, second, third)] == [
        Outcome.SUPERSEDED,
        Outcome.SUPERSEDED,
        Outcome.QUEUED,
    ]
    assert [e.message_id for e in calls.contexts["m2"].skipped] == ["m1"]
    assert [e.message_id for e in calls.contexts["m3"].skipped] == ["m1", "m2"]
    carried = calls.contexts["m3"].skipped[0]
    assert carried == Event("message", "slack", "C1", "T1", "m1")
    assert carried.raw == raw  # the whole event crossed, payload included
    tokens = [calls.contexts[m].token for m in ("m1", "m2", "m3")]
    assert all(a < b for a, b in itertools.pairwise(tokens))  # type: ignore[operator]
    # nothing left behind in the state once covered
    assert await state.supersede_collect("slack:C1:T1") == []  # type: ignore[attr-defined]


async def test_an_event_json_cannot_hold_is_logged_not_handed_over(
    state: State, peer_state: State, caplog: pytest.LogCaptureFixture
) -> None:
    older, newer, calls = bots(state, peer_state, grace=0.0)
    calls.hold["m1"] = 60.0
    first = asyncio.ensure_future(
        older.dispatch(Event("message", "slack", "C1", "T1", "m1", {"blob": object()}))
    )
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(newer.dispatch(ev("m2")))
    assert [await bounded(first), await bounded(second)] == [
        Outcome.SUPERSEDED,
        Outcome.QUEUED,
    ]
    assert calls.contexts["m2"].skipped == ()
    assert "is not handed over" in caplog.text
    assert "Event.raw['blob']" in caplog.text


async def test_carried_events_are_collected_once_in_order_and_expire(state: State) -> None:
    assert isinstance(state, SupersedeSignals)
    key = "slack:C9:carry"
    assert await state.supersede_collect(key) == []
    await state.supersede_carry(key, ["a", "b"], 30.0)
    await state.supersede_carry(key, [], 30.0)
    await state.supersede_carry(key, ['{"c": "é"}'], 30.0)
    assert await state.supersede_collect(key) == ["a", "b", '{"c": "é"}']
    assert await state.supersede_collect(key) == []
    await state.supersede_carry(key, ["gone"], 0.05)
    await asyncio.sleep(0.3)  # past the expiry: what nobody collected counts as absent
    assert await state.supersede_collect(key) == []
    await state.supersede_carry(key, ["after"], 30.0)  # an expired leftover is not appended to
    assert await state.supersede_collect(key) == ["after"]
    with pytest.raises(ValueError, match="ttl"):
        await state.supersede_carry(key, ["x"], 0)


async def test_keys_do_not_interrupt_each_other(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0)
    calls.hold["a1"] = 0.3
    first = asyncio.ensure_future(bot.dispatch(ev("a1", thread="A")))
    await asyncio.wait_for(calls.started_event("a1").wait(), SOON)
    assert await bot.dispatch(ev("b1", thread="B")) is Outcome.HANDLED
    assert await bounded(first) is Outcome.HANDLED
    assert not calls.contexts["a1"].superseded.is_set()


async def test_a_failing_covering_call_fails_the_events_it_covered(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0, raise_errors=False)
    calls.hold["m1"] = 60.0
    calls.fail.add("m2")
    first = asyncio.ensure_future(bot.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(bot.dispatch(ev("m2")))
    assert [await bounded(first), await bounded(second)] == [Outcome.FAILED, Outcome.FAILED]
    # not handled: their dedupe records are forgotten, so a redelivery runs
    calls.fail.clear()
    calls.hold.clear()
    assert await bounded(asyncio.ensure_future(bot.dispatch(ev("m1")))) is Outcome.HANDLED


async def test_redeliveries_are_duplicates(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0)
    calls.hold["m1"] = 60.0
    first = asyncio.ensure_future(bot.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    assert await bot.dispatch(ev("m1")) is Outcome.DUPLICATE  # no interruption by a duplicate
    assert not calls.contexts["m1"].superseded.is_set()
    second = asyncio.ensure_future(bot.dispatch(ev("m2")))
    assert [await bounded(first), await bounded(second)] == [
        Outcome.SUPERSEDED,
        Outcome.QUEUED,
    ]
    assert await bot.dispatch(ev("m1")) is Outcome.DUPLICATE  # superseded counts as covered
    # nothing left behind per key once idle (a duplicate's place in the line went with it)
    await asyncio.wait_for(bot.aclose(), SOON)
    assert isinstance(bot._route, SupersedeRoute)
    assert bot._route.lines == {}


async def test_deliver_tells_the_platform_a_superseded_event_arrived(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0)
    calls.hold["m1"] = 60.0
    first = asyncio.ensure_future(bot.deliver(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(bot.deliver(ev("m2")))
    one, two = await asyncio.wait_for(asyncio.gather(first, second), SOON)
    assert (one.outcome, one.redeliver) == (Outcome.SUPERSEDED, False)
    assert (two.outcome, two.redeliver) == (Outcome.QUEUED, False)


async def test_submit_supersedes_and_aclose_drains(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0)
    calls.hold["m1"] = 60.0
    first = bot.submit(ev("m1"))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = bot.submit(ev("m2"))
    await asyncio.wait_for(bot.aclose(), SOON)
    assert (first.result(), second.result()) == (Outcome.SUPERSEDED, Outcome.QUEUED)
    assert bot.in_flight == 0


async def test_a_cancelled_newer_dispatch_leaves_the_key_free(state: State) -> None:
    bot, _, calls = bots(state, state, grace=None)
    calls.hold["m1"] = 0.3
    first = asyncio.ensure_future(bot.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    second = asyncio.ensure_future(bot.dispatch(ev("m2")))
    await asyncio.wait_for(calls.contexts["m1"].superseded.wait(), SOON)  # m2 has joined
    second.cancel()
    assert await bounded(first) is Outcome.SUPERSEDED
    with pytest.raises(asyncio.CancelledError):
        await second
    assert sorted(calls.contexts) == ["m1"]  # nothing left to run m2 for
    assert await bot.dispatch(ev("m3")) is Outcome.HANDLED  # the key is free, not leaked
    assert await state.inspect("slack:C1:T1") is None


async def test_a_cancelled_holder_dispatch_releases_the_key(state: State) -> None:
    bot, _, calls = bots(state, state, grace=0.0)
    calls.hold["m1"] = 0.2
    first = asyncio.ensure_future(bot.dispatch(ev("m1")))
    await asyncio.wait_for(calls.started_event("m1").wait(), SOON)
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(bot.aclose(), SOON)  # the call ends; its lock is released
    assert await state.inspect("slack:C1:T1") is None


class TestConstruction:
    def test_grace_must_be_seconds_or_none(self) -> None:
        with pytest.raises(ValueError, match=r"supersede_grace.*-1"):
            EventDispatcher(MemoryState(), on_lock_conflict="supersede", supersede_grace=-1)
        with pytest.raises(TypeError, match="supersede_grace"):
            EventDispatcher(
                MemoryState(),
                on_lock_conflict="supersede",
                supersede_grace="soon",  # type: ignore[arg-type]
            )

    def test_the_policy_name_is_listed(self) -> None:
        with pytest.raises(ValueError, match="supersede"):
            EventDispatcher(MemoryState(), on_lock_conflict="supercede")  # type: ignore[arg-type]

    async def test_a_policy_function_cannot_pick_it(self) -> None:
        # the holder must subscribe before it takes the lock: only a dispatcher-wide policy
        bot = EventDispatcher(
            MemoryState(),
            on_lock_conflict=lambda key, event: "supersede",  # type: ignore[arg-type,return-value]
            raise_errors=False,
        )
        started = asyncio.Event()

        @bot.on("message")
        async def slow(event: Event) -> None:
            started.set()
            await asyncio.sleep(0.2)

        first = asyncio.ensure_future(bot.dispatch(ev("m1")))
        await started.wait()
        assert await bot.dispatch(ev("m2")) is Outcome.FAILED
        assert await first is Outcome.HANDLED


@given(bursts=st.lists(st.integers(min_value=1, max_value=3), max_size=4))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_model_of_bursts_that_supersede(bursts: list[int]) -> None:
    """Bursts of events, each arriving while a call runs (a model of ``supersede``).

    The first event starts a call; each burst interrupts the running call (grace ``None``: the
    handler returns once flagged) and the next call handles the burst's last event with every
    earlier event in ``ctx.skipped``. Whatever the bursts, every event is accounted for once:
    each interrupted call's event ``SUPERSEDED``, the last call's ``QUEUED`` (``HANDLED``
    alone), all others ``SKIPPED``; ``ctx.skipped`` in arrival order; tokens increasing.
    """
    asyncio.run(_bursts(bursts))


async def _bursts(bursts: list[int]) -> None:
    bot = EventDispatcher(MemoryState(), on_lock_conflict="supersede", supersede_grace=None)
    calls: list[tuple[str, list[str], int | None]] = []
    started: list[asyncio.Event] = [asyncio.Event() for _ in range(len(bursts) + 1)]
    last_call = asyncio.Event()

    @bot.on("message")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        index = len(calls)
        skipped = [str(e.raw["n"]) for e in ctx.skipped]
        calls.append((str(event.raw["n"]), skipped, ctx.token))
        started[index].set()
        if index < len(bursts):
            await ctx.superseded.wait()
        else:
            await last_call.wait()

    def event(n: int) -> Event:  # no message id: no dedupe claim, so arrival is immediate
        return Event("message", "slack", "C1", "T1", None, {"n": f"e{n}"})

    tasks = [asyncio.ensure_future(bot.dispatch(event(0)))]
    names = ["e0"]
    for round_, size in enumerate(bursts):
        await asyncio.wait_for(started[round_].wait(), SOON)
        for _ in range(size):
            names.append(f"e{len(names)}")
            tasks.append(asyncio.ensure_future(bot.dispatch(event(len(names) - 1))))
    await asyncio.wait_for(started[len(bursts)].wait(), SOON)
    last_call.set()
    outcomes = dict(zip(names, await asyncio.wait_for(asyncio.gather(*tasks), SOON), strict=True))
    await bot.aclose()

    handled = ["e0"]
    count = 1
    for size in bursts:
        count += size
        handled.append(f"e{count - 1}")
    assert [name for name, _, _ in calls] == handled
    for name, skipped, _ in calls:  # every earlier event, in arrival order
        assert skipped == names[: names.index(name)]
    tokens = [token for _, _, token in calls]
    assert all(a < b for a, b in itertools.pairwise(tokens))  # type: ignore[operator]
    expected = dict.fromkeys(names, Outcome.SKIPPED)
    for name in handled[:-1]:
        expected[name] = Outcome.SUPERSEDED
    expected[handled[-1]] = Outcome.QUEUED if bursts else Outcome.HANDLED
    assert outcomes == expected
