"""Model-based test of the dispatcher's conflict policies: no event is ever lost, order is kept.

A Hypothesis ``RuleBasedStateMachine`` picks a policy (``queue``, ``latest``, ``debounce``,
``drop``), a lock scope (``thread`` or ``channel``) and which event types have handlers of their
own (maybe a catch-all ``"*"``, maybe none for some types), then interleaves at random: events of
several types in several threads, redeliveries of earlier ids, blocking holders that force
conflicts, and a few loop turns between steps. Once everything has settled it checks, for every
dispatch, that the event was

* ``HANDLED``, ``QUEUED`` or ``FORCED``: given to the handlers of its type (when it has any);
* ``SKIPPED``: in the ``ctx.skipped`` of exactly one handler call *for its own thread*, made by a
  handler of its own type whenever that type has one (else by the catch-all, when there is one);
* ``DUPLICATE``: another dispatch of the same id was not lost;
* ``DROPPED``: redeliverable: dispatching it again once the keys are free handles it;

and that under ``queue``, per lock key, handlers ran in the order the dispatches started in, with
never two at once on one key. Each machine runs its own event loop (as ``test_stateful.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import TYPE_CHECKING, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from asynclock import Event, EventDispatcher, HandlerContext, MemoryState, Outcome, state_from_url
from tests._matrix import purge_namespace
from tests.conformance.test_stateful import LoopRunner

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock import State
    from asynclock._dispatch.policies import PolicyName
    from tests._matrix import Backend

TYPES = ("mention", "message", "reaction")
THREADS = ("T1", "T2", "T3")
CHANNELS = ("C1", "C2")
IDS = tuple(f"m{n}" for n in range(12))
SETTLE = 30.0  # seconds for every dispatch to end once the holders are let go

COVERED = {Outcome.HANDLED, Outcome.QUEUED, Outcome.FORCED, Outcome.SKIPPED}


class Call:
    """One handler call: which registration ran, for which event, with what skipped."""

    def __init__(self, registered: str, event: Event, ctx: HandlerContext) -> None:
        self.registered = registered
        self.event = event
        self.skipped = ctx.skipped
        self.lock_key = ctx.lock_key


class DispatcherMachine(RuleBasedStateMachine):
    #: set on the per-backend subclass that the test builds
    backend: ClassVar[Backend]

    def __init__(self) -> None:
        super().__init__()
        self.namespace = uuid.uuid4().hex
        self.runner = LoopRunner()
        self.state: State = self.runner.run(self._open())
        self.bot: EventDispatcher | None = None
        self.policy: PolicyName = "queue"
        self.own: frozenset[str] = frozenset()
        self.catch_all = False
        self.gate = asyncio.Event()
        self.calls: list[Call] = []
        self.inside: Counter[str] = Counter()
        self.most_inside = 0
        #: (event, task) in the order the dispatches started
        self.sent: list[tuple[Event, asyncio.Task[Outcome]]] = []
        self.started: list[tuple[str, str]] = []  # (lock key, message id) at dispatch start

    async def _open(self) -> State:
        if not self.backend.server:
            return MemoryState()
        return state_from_url(self.backend.url, **self.backend.options(self.namespace))

    @initialize(
        policy=st.sampled_from(["queue", "latest", "debounce", "drop"]),
        scope=st.sampled_from(["thread", "channel"]),
        own=st.sets(st.sampled_from(TYPES)),
        catch_all=st.booleans(),
    )
    def configure(self, policy: PolicyName, scope: str, own: set[str], catch_all: bool) -> None:
        self.policy = policy
        self.own = frozenset(own)
        self.catch_all = catch_all
        self.bot = EventDispatcher(
            self.state,
            on_lock_conflict=policy,
            lock_scope="thread" if scope == "thread" else "channel",
            debounce=0.01,
            lock_ttl=30.0,
        )
        for registered in sorted(own) + (["*"] if catch_all else []):
            self.bot.add_handler(registered, self._handler(registered))

    def _handler(self, registered: str) -> Callable[[Event, HandlerContext], Awaitable[None]]:
        async def handle(event: Event, ctx: HandlerContext) -> None:
            self.calls.append(Call(registered, event, ctx))
            self.inside[ctx.lock_key] += 1
            self.most_inside = max(self.most_inside, self.inside[ctx.lock_key])
            try:
                if event.raw.get("block"):
                    await self.gate.wait()
                await asyncio.sleep(0)
            finally:
                self.inside[ctx.lock_key] -= 1

        return handle

    async def _turns(self, turns: int) -> None:
        for _ in range(turns):
            await asyncio.sleep(0)

    def _send(self, event: Event, turns: int) -> None:
        bot = self.bot
        assert bot is not None

        async def start() -> None:
            self.started.append((bot.lock_key(event), event.message_id or ""))
            self.sent.append((event, asyncio.ensure_future(bot.dispatch(event))))
            await self._turns(turns)

        self.runner.run(start())

    @rule(
        kind=st.sampled_from(TYPES),
        thread=st.sampled_from(THREADS),
        channel=st.sampled_from(CHANNELS),
        message=st.sampled_from(IDS),
        block=st.booleans(),
        turns=st.integers(0, 6),
    )
    def dispatch(
        self, kind: str, thread: str, channel: str, message: str, block: bool, turns: int
    ) -> None:
        raw = {"block": True} if block and not self.gate.is_set() else {}
        self._send(Event(kind, "slack", channel, thread, message, raw), turns)

    @rule(index=st.integers(0, 100), turns=st.integers(0, 6))
    def redeliver(self, index: int, turns: int) -> None:
        if self.sent:
            event = self.sent[index % len(self.sent)][0]
            again = Event(event.type, "slack", event.channel_id, event.thread_id, event.message_id)
            self._send(again, turns)

    @rule()
    def let_go(self) -> None:
        """The blocking holders finish; later holders do not block any more."""
        self.gate.set()
        self.runner.run(self._turns(3))

    def teardown(self) -> None:
        try:
            if self.bot is not None:
                self.runner.run(self._settle_and_check())
        finally:
            try:
                self.runner.run(self._close())
            finally:
                self.runner.close()

    async def _close(self) -> None:
        await self.state.aclose()
        await purge_namespace(self.backend, self.namespace)

    async def _settle_and_check(self) -> None:
        bot = self.bot
        assert bot is not None
        self.gate.set()
        outcomes = await asyncio.wait_for(asyncio.gather(*(task for _, task in self.sent)), SETTLE)
        results = list(zip((event for event, _ in self.sent), outcomes, strict=True))
        assert self.most_inside <= 1, "two handlers ran at once on one key"
        for event, outcome in results:
            assert outcome in COVERED | {Outcome.DUPLICATE, Outcome.DROPPED}, (event, outcome)
            if outcome in (Outcome.HANDLED, Outcome.QUEUED, Outcome.FORCED):
                self._check_handled(event)
            elif outcome is Outcome.SKIPPED:
                self._check_skipped(event)
        identity = {id(e): (bot.lock_key(e), e.message_id) for e, _ in results}
        covered = {identity[id(e)] for e, o in results if o in COVERED}
        for event, outcome in results:
            if outcome is Outcome.DUPLICATE:
                # the id's other dispatch covered it, or dropped it (then it is redelivered below)
                assert any(
                    identity[id(e)] == identity[id(event)] and o is not Outcome.DUPLICATE
                    for e, o in results
                ), f"{event.message_id} is a duplicate of nothing"
        if self.policy == "queue":
            self._check_order(results)
        # every id that nothing covered was dropped, and its redelivery is handled now
        for key, message in sorted(set(identity.values()) - covered):
            event = next(e for e, _ in results if identity[id(e)] == (key, message))
            again = await asyncio.wait_for(bot.dispatch(event), SETTLE)
            assert again is Outcome.HANDLED, f"dropped {message} is not redeliverable: {again}"
        await bot.aclose()

    def _expected_registrations(self, event: Event) -> set[str]:
        own = {event.type} if event.type in self.own else set()
        return own | ({"*"} if self.catch_all else set())

    def _check_handled(self, event: Event) -> None:
        ran = {c.registered for c in self.calls if c.event is event}
        assert ran == self._expected_registrations(event), (event, ran)

    def _check_skipped(self, event: Event) -> None:
        into = [c for c in self.calls if any(s is event for s in c.skipped)]
        registrations = {c.registered for c in into}
        hosts = {id(c.event) for c in into}
        assert len(hosts) == 1, f"{event.message_id} skipped into {len(hosts)} events' calls"
        host = into[0].event
        assert host.thread_key == event.thread_key, (
            f"{event.message_id} of {event.thread_key} skipped into a call for {host.thread_key}"
        )
        if event.type in self.own:
            assert event.type in registrations, (
                f"{event.type} {event.message_id} skipped into {registrations}, not its own handler"
            )
        elif self.catch_all:
            assert "*" in registrations, (event, registrations)

    def _check_order(self, results: list[tuple[Event, Outcome]]) -> None:
        handled_ids = {e.message_id for e, o in results if o in (Outcome.HANDLED, Outcome.QUEUED)}
        bot = self.bot
        assert bot is not None
        per_key_calls: dict[str, list[str]] = {}
        seen_call: set[int] = set()
        for call in self.calls:
            if id(call.event) in seen_call:
                continue  # several registrations for one event: one handling
            seen_call.add(id(call.event))
            per_key_calls.setdefault(call.lock_key, []).append(call.event.message_id or "")
        for key, handled in per_key_calls.items():
            arrival = [m for k, m in self.started if k == key and m in handled_ids]
            # an id is handled at most once; its first dispatch is the one that ran
            first_arrival = list(dict.fromkeys(arrival))
            outcomes = [(e.message_id, o.value) for e, o in results if bot.lock_key(e) == key]
            assert handled == [m for m in first_arrival if m in handled], (key, handled, outcomes)


def _run(backend: Backend, examples: int) -> None:
    machine = type(f"DispatcherMachine_{backend.name}", (DispatcherMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_dispatcher_policies_lose_nothing_and_keep_order(backend: Backend) -> None:
    _run(backend, 60 if not backend.server else 20)
