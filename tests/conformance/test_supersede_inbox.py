"""``supersede`` over the durable inbox (``accept`` + ``serve``), on every inbox backend
(SPEC section 10).

A worker (``serve``) drains on one client; events are accepted on another (a web process's).
An accept for a key whose call runs interrupts it by the state's push; the covering call gets
the interrupted entry and the newer ones, under a higher fencing token, and acknowledges them
only once it returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING

import pytest

from asynclock import Event, EventDispatcher, HandlerContext, Outcome
from tests._matrix import INBOX_STATES, Backend, purge_namespace, require
from tests.conformance.test_inbox import Namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


SOON = 10.0
#: the accept reaches the running handler within this (a push, not the rescan's poll)
PROMPT = 0.8


def ev(n: int) -> Event:
    return Event("message", "slack", "C1", "T1", f"m{n}")


@pytest.fixture(params=INBOX_STATES)
async def space(request: pytest.FixtureRequest) -> AsyncIterator[Namespace]:
    backend: Backend = request.param
    require(backend)
    made = Namespace(backend)
    yield made
    await purge_namespace(backend, made.namespace)


class Stream:
    """A handler that streams until told otherwise; records what each call saw."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str], int | None, int]] = []
        self.started: dict[str, asyncio.Event] = {}
        self.flagged_at: dict[str, float] = {}
        self.ended: dict[str, str] = {}
        self.hold: dict[str, float] = {}
        self.fail_once: set[str] = set()

    def started_event(self, message_id: str) -> asyncio.Event:
        return self.started.setdefault(message_id, asyncio.Event())

    async def __call__(self, event: Event, ctx: HandlerContext) -> None:
        message_id = event.message_id or ""
        skipped = [e.message_id or "" for e in ctx.skipped]
        self.calls.append((message_id, skipped, ctx.token, ctx.attempt))
        self.started_event(message_id).set()

        async def note() -> None:
            await ctx.superseded.wait()
            self.flagged_at[message_id] = time.monotonic()

        watcher = asyncio.ensure_future(note())
        try:
            if message_id in self.fail_once:
                self.fail_once.discard(message_id)
                raise RuntimeError(f"{message_id} fails once")
            await asyncio.sleep(self.hold.get(message_id, 0.0))
            self.ended[message_id] = "returned"
        except asyncio.CancelledError:
            self.ended[message_id] = "cancelled"
            raise
        finally:
            await asyncio.sleep(0)
            watcher.cancel()


@contextlib.asynccontextmanager
async def serving(
    space: Namespace, grace: float | None = 0.0, max_attempts: int = 5
) -> AsyncIterator[tuple[EventDispatcher, EventDispatcher, Stream, list[tuple[str, Outcome]]]]:
    """A worker serving on its own client, a web dispatcher accepting on another."""
    stream = Stream()
    outcomes: list[tuple[str, Outcome]] = []
    worker_state, web_state = space.open(), space.open()

    def record(event: Event, outcome: Outcome, error: BaseException | None) -> None:
        outcomes.append((event.message_id or "", outcome))

    options: dict[str, object] = {"on_lock_conflict": "supersede", "supersede_grace": grace}
    worker = EventDispatcher(
        worker_state,
        on_outcome=record,
        lock_ttl=5.0,
        max_attempts=max_attempts,
        **options,  # type: ignore[arg-type]
    )
    web = EventDispatcher(web_state, lock_ttl=5.0, **options)  # type: ignore[arg-type]
    worker.add_handler("message", stream)
    serve = asyncio.ensure_future(worker.serve())
    try:
        yield worker, web, stream, outcomes
    finally:
        await asyncio.wait_for(worker.aclose(), SOON)
        await asyncio.wait_for(serve, SOON)
        for state in {id(worker_state): worker_state, id(web_state): web_state}.values():
            await state.aclose()


async def until(predicate: object, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + SOON
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {SOON} s for: {what}")
        await asyncio.sleep(0.005)


async def test_an_accept_interrupts_the_running_call(space: Namespace) -> None:
    async with serving(space, grace=0.0) as (_, web, stream, outcomes):
        stream.hold["m1"] = 60.0
        assert await web.accept(ev(1)) is Outcome.ACCEPTED
        await asyncio.wait_for(stream.started_event("m1").wait(), SOON)
        sent = time.monotonic()
        assert await web.accept(ev(2)) is Outcome.ACCEPTED
        await asyncio.wait_for(stream.started_event("m2").wait(), SOON)
        await until(lambda: len(outcomes) == 2, "both outcomes")
    assert stream.flagged_at["m1"] - sent < PROMPT
    assert stream.ended == {"m1": "cancelled", "m2": "returned"}
    (first, _, token1, _), (second, skipped, token2, attempt) = stream.calls
    assert (first, second, skipped) == ("m1", "m2", ["m1"])
    assert token2 > token1  # type: ignore[operator]
    assert attempt == 2  # the interruption was m1's first delivery
    assert sorted(outcomes) == [("m1", Outcome.SUPERSEDED), ("m2", Outcome.HANDLED)]


async def test_entries_that_arrive_meanwhile_are_skipped_in_accept_order(space: Namespace) -> None:
    async with serving(space, grace=None) as (_, web, stream, outcomes):
        stream.hold["m1"] = 0.5  # ignores the flag
        await web.accept(ev(1))
        await asyncio.wait_for(stream.started_event("m1").wait(), SOON)
        for n in (2, 3, 4):
            await web.accept(ev(n))
        await until(lambda: len(outcomes) == 4, "every outcome")
    assert stream.ended["m1"] == "returned"
    assert "m1" in stream.flagged_at
    assert [(m, s) for m, s, _, _ in stream.calls] == [("m1", []), ("m4", ["m1", "m2", "m3"])]
    assert sorted(outcomes) == [
        ("m1", Outcome.SUPERSEDED),
        ("m2", Outcome.SKIPPED),
        ("m3", Outcome.SKIPPED),
        ("m4", Outcome.HANDLED),
    ]


async def test_an_entry_already_in_the_batch_interrupts_nothing(space: Namespace) -> None:
    async with serving(space, grace=0.0) as (_, web, stream, outcomes):
        await web.accept(ev(1))
        await until(lambda: len(outcomes) == 1, "m1 handled")
        stream.hold["m2"] = 0.3
        await web.accept(ev(2))  # its own signal reaches its own call: nothing newer pending
        await until(lambda: len(outcomes) == 2, "m2 handled")
    assert stream.ended == {"m1": "returned", "m2": "returned"}
    assert "m2" not in stream.flagged_at
    assert outcomes == [("m1", Outcome.HANDLED), ("m2", Outcome.HANDLED)]


async def test_interruptions_do_not_bring_the_dead_letter_nearer(space: Namespace) -> None:
    # max_attempts=2: m1 is delivered three times (interrupted twice) before its covering call
    # fails once; that failure is its first, so it is retried, not dead-lettered
    async with serving(space, grace=0.0, max_attempts=2) as (_, web, stream, outcomes):
        stream.hold.update({"m1": 60.0, "m2": 60.0})
        stream.fail_once.add("m3")
        await web.accept(ev(1))
        await asyncio.wait_for(stream.started_event("m1").wait(), SOON)
        await web.accept(ev(2))
        await asyncio.wait_for(stream.started_event("m2").wait(), SOON)
        await web.accept(ev(3))
        await until(lambda: ("m3", Outcome.HANDLED) in outcomes, "m3 handled")
    assert [(m, s, a) for m, s, _, a in stream.calls] == [
        ("m1", [], 1),
        ("m2", ["m1"], 2),
        ("m3", ["m1", "m2"], 3),  # raised
        ("m3", ["m1", "m2"], 4),
    ]
    assert outcomes[-3:] == [
        ("m1", Outcome.SUPERSEDED),
        ("m2", Outcome.SUPERSEDED),
        ("m3", Outcome.HANDLED),
    ]
