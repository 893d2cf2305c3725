"""Inbox retries that wait, and poison that parks its key (SPEC section 9, INBOX_PROTOCOL.md).

State-level first (every rule of ``inbox_step(retry_in=..., park=...)``, ``inbox_take``,
``inbox_requeue``, ``inbox_discard`` and ``inbox_keys``), on every backend with the inbox
(``INBOX_STATES``); two clients of one namespace stand in for two worker processes.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pytest

from asynclock import EventDispatcher, HandlerContext, LockNotOwnedError, MemoryState, Outcome
from asynclock._events.codec import encode
from asynclock.cli._main import main
from asynclock.cli._worker import format_inbox
from asynclock.state._protocol import InboxKey, InboxState, State
from tests._matrix import (
    INBOX_SERVER_STATES,
    INBOX_STATES,
    Backend,
    purge_namespace,
    require,
)
from tests.conformance.test_inbox import SOON, Namespace, close_all, ev

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from asynclock import Event
    from asynclock.state._protocol import InboxGrant, InboxWorker

ROOT = Path(__file__).resolve().parents[2]
KEY = "slack:C1:T1"
#: how long an absent hand-out is waited for (a pushed one takes about a millisecond)
QUIET = 0.3
#: how far the state's clock (a server's) and this process's may disagree about a duration
SKEW = 0.05
#: a wait that outlasts the checks made during it (several round trips and a ``QUIET`` wait,
#: slow on a loaded machine): a shorter one could come due before they end
CHECKED_WAIT = 2.0


class Inbox(InboxState, State, Protocol):
    """A state with the inbox (and the locks every state has)."""


@pytest.fixture(params=INBOX_STATES)
async def space(request: pytest.FixtureRequest) -> AsyncIterator[Namespace]:
    backend: Backend = request.param
    require(backend)
    made = Namespace(backend)
    yield made
    await purge_namespace(backend, made.namespace)


@pytest.fixture
async def state(space: Namespace) -> AsyncIterator[Inbox]:
    opened = open_inbox(space)
    yield opened
    await opened.aclose()


def open_inbox(space: Namespace) -> Inbox:
    opened = space.open()
    assert isinstance(opened, InboxState)
    return opened


async def accept(
    state: InboxState, *events: Event, max_pending: int = 100, with_entry: bool = True
) -> list[str]:
    """Accept ``events`` (each a new entry of its thread's key); their statuses. ``with_entry``
    as the deployment's workers (``inbox_worker``) pass it."""
    statuses = []
    for event in events:
        accepted = await state.inbox_accept(
            event.thread_key,
            encode(event),
            claim=None,
            claim_ttl=60.0,
            max_pending=max_pending,
            with_entry=with_entry,
        )
        statuses.append(accepted.status)
    return statuses


def message_of(grant: InboxGrant) -> tuple[str, int]:
    """The message id and attempt of the entry handed out with ``grant``."""
    assert grant.entry is not None
    return json.loads(grant.entry.payload)["message_id"], grant.entry.attempt


async def key_info(state: InboxState, key: str = KEY) -> InboxKey | None:
    return next((k for k in await state.inbox_keys() if k.key == key), None)


async def handed(worker: InboxWorker, key: str = KEY) -> InboxGrant:
    """The next grant for ``key`` (another key's grant fails the test)."""
    grant = await worker.next(SOON)
    assert grant is not None, f"{key} was not handed out"
    assert grant.key == key
    return grant


async def nothing_handed(state: Inbox, worker: InboxWorker, key: str = KEY) -> None:
    """``key`` is neither handed out, listed by the rescan, taken, nor locked."""
    assert await worker.next(QUIET) is None, "a waiting or parked key was handed out"
    assert key not in await state.inbox_ready()
    assert await worker.take(key) is None
    assert await state.inspect(key) is None, "a waiting or parked key holds its lock"


async def due(state: InboxState, key: str = KEY) -> float:
    """Wait until the rescan lists ``key`` again; how long that took (seconds)."""
    began = time.monotonic()
    while key not in await state.inbox_ready():
        assert time.monotonic() - began < SOON, f"{key} never became due"
        await asyncio.sleep(0.01)
    return time.monotonic() - began


class TestRetryThatWaits:
    async def test_the_step_releases_the_lock_and_the_head_stays(self, state: Inbox) -> None:
        assert await accept(state, ev(1), ev(2)) == ["accepted", "accepted"]
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert message_of(grant) == ("m1", 1)
            assert grant.entry is not None
            left = await state.inbox_step(KEY, grant.owner, done=grant.entry.id, retry_in=30.0)
            assert left is None
            await nothing_handed(state, worker)
        info = await key_info(state)
        assert info is not None
        assert (info.pending, info.dead, info.parked) == (2, 0, False)
        assert info.retry_in is not None
        assert 25.0 < info.retry_in <= 30.0

    async def test_accepts_during_the_wait_append_and_hand_out_nothing(self, state: Inbox) -> None:
        await accept(state, ev(1))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            await state.inbox_step(KEY, grant.owner, done=grant.entry.id, retry_in=30.0)
            assert await accept(state, ev(2), ev(3), max_pending=3) == ["accepted", "accepted"]
            # the waiting head counts: three pending
            assert await accept(state, ev(4), max_pending=3) == ["full"]
            await nothing_handed(state, worker)
        info = await key_info(state)
        assert info is not None
        assert info.pending == 3
        assert info.retry_in is not None

    async def test_due_it_is_taken_with_its_attempt_counted_once_more(self, state: Inbox) -> None:
        await accept(state, ev(1), ev(2))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            before = time.monotonic()
            await state.inbox_step(KEY, grant.owner, done=grant.entry.id, retry_in=0.6)
            assert await worker.take(KEY) is None  # not due yet
            await due(state)
            waited = time.monotonic() - before
            assert waited >= 0.6 - SKEW, f"listed after {waited:.3f} s, before it was due"
            assert waited < 0.6 + 1.0
            info = await key_info(state)
            assert info is not None
            assert info.retry_in == 0.0  # due, not taken yet
            again = await worker.take(KEY)
            assert again is not None
            assert again.key == KEY
            assert message_of(again) == ("m1", 2)
            info = await key_info(state)
            assert info is not None
            assert info.retry_in is None
            assert again.entry is not None
            then = await state.inbox_step(KEY, again.owner, done=again.entry.id)
            assert then is not None
            assert (json.loads(then.payload)["message_id"], then.attempt) == ("m2", 1)
            assert await state.inbox_step(KEY, again.owner, done=then.id) is None

    async def test_an_accept_that_finds_it_due_and_free_hands_it_out(self, state: Inbox) -> None:
        await accept(state, ev(1))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            await state.inbox_step(KEY, grant.owner, done=grant.entry.id, retry_in=0.3)
            await due(state)
            assert await accept(state, ev(2)) == ["accepted"]
            again = await handed(worker)
            assert message_of(again) == ("m1", 2)

    async def test_the_wait_is_in_the_state_for_every_client(self, space: Namespace) -> None:
        first, other = open_inbox(space), open_inbox(space)  # other: another process's client
        try:
            await accept(first, ev(1))
            # other's first call (connections, the SQL states' schema check) before the wait
            # starts: under load it can outlast the 0.5 s the checks below must fit in
            assert await key_info(other) is not None
            async with first.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
                grant = await handed(worker)
                assert grant.entry is not None
                await first.inbox_step(KEY, grant.owner, done=grant.entry.id, retry_in=CHECKED_WAIT)
            info = await key_info(other)
            assert info is not None
            assert info.retry_in is not None
            async with other.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
                await nothing_handed(other, worker)
                await due(other)
                again = await worker.take(KEY)
                assert again is not None
                assert message_of(again) == ("m1", 2)
        finally:
            await close_all(first, other)

    async def test_the_retry_is_fenced(self, state: Inbox) -> None:
        await accept(state, ev(1))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            with pytest.raises(LockNotOwnedError):
                await state.inbox_step(KEY, "someone", done=grant.entry.id, retry_in=5.0)
            with pytest.raises(LockNotOwnedError):
                await state.inbox_step(KEY, "someone", done=grant.entry.id, dead="Boom", park=True)
            info = await key_info(state)
            assert info is not None
            assert (info.retry_in, info.parked, info.dead) == (None, False, 0)
            held = await state.inspect(KEY)
            assert held is not None
            assert held.owner == grant.owner

    @pytest.mark.parametrize(
        ("options", "error", "shown"),
        [
            ({"retry_in": 0}, ValueError, "0"),
            ({"retry_in": -1.5}, ValueError, "-1.5"),
            ({"retry_in": math.nan}, ValueError, "nan"),
            ({"retry_in": math.inf}, ValueError, "inf"),
            ({"retry_in": "5"}, TypeError, "'5'"),
            ({"retry_in": True}, TypeError, "True"),
            ({"retry_in": 5.0, "dead": "Boom"}, ValueError, "'Boom'"),
            ({"retry_in": 5.0, "done": None}, ValueError, "done=None"),
            ({"park": True}, ValueError, "dead=None"),
            ({"park": True, "dead": "Boom", "done": None}, ValueError, "done=None"),
            ({"park": True, "dead": "Boom", "retry_in": 5.0}, ValueError, "5.0"),
            ({"park": "yes", "dead": "Boom"}, TypeError, "'yes'"),
        ],
    )
    async def test_bad_arguments_name_the_value_and_change_nothing(
        self, state: Inbox, options: dict[str, object], error: type[Exception], shown: str
    ) -> None:
        await accept(state, ev(1))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            step: dict[str, object] = {"done": grant.entry.id, **options}
            with pytest.raises(error, match=r"retry_in|park") as raised:
                await state.inbox_step(KEY, grant.owner, **step)  # type: ignore[arg-type]
            assert shown in str(raised.value)
            assert KEY in str(raised.value)
            batch: dict[str, object] = {
                "done": () if step["done"] is None else [grant.entry.id],
                **{k: v for k, v in options.items() if k != "done"},
            }
            with pytest.raises(error, match=r"retry_in|park"):
                await state.inbox_take(KEY, grant.owner, limit=0, **batch)  # type: ignore[arg-type]
            info = await key_info(state)
            assert info is not None
            assert (info.pending, info.dead, info.retry_in, info.parked) == (1, 0, None, False)
            held = await state.inspect(KEY)
            assert held is not None
            assert held.owner == grant.owner


class TestPark:
    async def test_a_parked_key_holds_no_lock_and_is_never_handed_out(self, state: Inbox) -> None:
        await accept(state, ev(1), ev(2))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            parked = await state.inbox_step(
                KEY, grant.owner, done=grant.entry.id, dead="Boom: poison", park=True
            )
            assert parked is None
            await nothing_handed(state, worker)
            assert await accept(state, ev(3), max_pending=2) == ["accepted"]  # appends
            assert await accept(state, ev(4), max_pending=2) == ["full"]
            await nothing_handed(state, worker)
        info = await key_info(state)
        assert info is not None
        assert (info.pending, info.dead, info.parked, info.retry_in) == (2, 1, True, None)
        [letter] = await state.inbox_dead_letters(KEY)
        assert (letter.attempts, letter.error) == (1, "Boom: poison")
        assert json.loads(letter.payload)["message_id"] == "m1"

    async def test_a_parked_key_is_listed_with_nothing_pending(self, space: Namespace) -> None:
        first, other = open_inbox(space), open_inbox(space)
        try:
            await accept(first, ev(1))
            async with first.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
                grant = await handed(worker)
                assert grant.entry is not None
                await first.inbox_step(KEY, grant.owner, done=grant.entry.id, dead="x", park=True)
            info = await key_info(other)  # in the state: another client sees it
            assert info is not None
            assert (info.pending, info.dead, info.parked) == (0, 1, True)
            assert await other.inbox_discard(KEY) == 1
            assert await key_info(other) is None  # nothing left of the key
        finally:
            await close_all(first, other)

    async def test_requeue_unparks_and_restarts_the_attempts(self, state: Inbox) -> None:
        await accept(state, ev(1), ev(2))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            # delivered twice already: the requeued entry still starts again at attempt 1
            again = await state.inbox_step(KEY, grant.owner, take=True)
            assert again is not None
            assert again.attempt == 2
            await state.inbox_step(KEY, grant.owner, done=again.id, dead="Boom", park=True)
            await accept(state, ev(3))
            assert await state.inbox_requeue(KEY) == 1
            info = await key_info(state)
            assert info is not None
            assert (info.pending, info.dead, info.parked) == (3, 0, False)
            requeued = await handed(worker)
            assert message_of(requeued) == ("m1", 1)
            order = []
            entry = requeued.entry
            while entry is not None:
                order.append((json.loads(entry.payload)["message_id"], entry.attempt))
                entry = await state.inbox_step(KEY, requeued.owner, done=entry.id)
        assert order == [("m1", 1), ("m2", 1), ("m3", 1)]
        assert await key_info(state) is None

    async def test_discard_deletes_the_dead_letter_and_the_key_goes_on(self, state: Inbox) -> None:
        await accept(state, ev(1), ev(2))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            await state.inbox_step(KEY, grant.owner, done=grant.entry.id, dead="Boom", park=True)
            assert await state.inbox_discard(KEY) == 1
            assert await state.inbox_dead_letters(KEY) == []
            info = await key_info(state)
            assert info is not None
            assert (info.pending, info.dead, info.parked) == (1, 0, False)
            next_one = await handed(worker)
            assert message_of(next_one) == ("m2", 1)

    async def test_discard_without_dead_letters(self, state: Inbox) -> None:
        assert await state.inbox_discard(KEY) == 0
        assert await state.inbox_discard("slack:C1:nowhere") == 0
        await accept(state, ev(1))
        assert await state.inbox_discard(KEY) == 0
        info = await key_info(state)
        assert info is not None
        assert (info.pending, info.parked) == (1, False)

    async def test_dead_letter_without_park_lets_the_key_go_on(self, state: Inbox) -> None:
        # the default poison policy, unchanged: the key is not parked
        await accept(state, ev(1), ev(2))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            after = await state.inbox_step(KEY, grant.owner, done=grant.entry.id, dead="Boom")
            assert after is not None
            assert json.loads(after.payload)["message_id"] == "m2"
            info = await key_info(state)
            assert info is not None
            assert (info.parked, info.dead) == (False, 1)


class TestBatches:
    """``inbox_take``, the batch form (``latest`` / ``debounce``), waits and parks the same."""

    async def taken(self, worker: InboxWorker) -> InboxGrant:
        grant = await worker.next(SOON)
        assert grant is not None
        assert grant.key == KEY
        assert grant.entry is None
        return grant

    async def test_a_batch_retry_keeps_its_entries_and_waits(self, state: Inbox) -> None:
        await accept(state, ev(1), ev(2), with_entry=False)
        async with state.inbox_worker(lock_ttl=5.0, with_entry=False) as worker:
            grant = await self.taken(worker)
            batch = await state.inbox_take(KEY, grant.owner, limit=5)
            assert batch is not None
            assert [e.attempt for e in batch.entries] == [1, 1]
            ids = [e.id for e in batch.entries]
            before = time.monotonic()
            left = await state.inbox_take(
                KEY, grant.owner, done=ids, retry_in=CHECKED_WAIT, limit=5
            )
            assert left is None
            info = await key_info(state)
            assert info is not None
            assert (info.pending, info.dead, info.parked) == (2, 0, False)
            assert info.retry_in is not None
            assert 0.0 < info.retry_in <= CHECKED_WAIT
            assert await accept(state, ev(3), with_entry=False) == ["accepted"]
            await nothing_handed(state, worker)
            await due(state)
            waited = time.monotonic() - before
            assert waited >= CHECKED_WAIT - SKEW, f"listed after {waited:.3f} s, before it was due"
            again = await worker.take(KEY)
            assert again is not None
            assert again.key == KEY
            batch = await state.inbox_take(KEY, again.owner, limit=5)
            assert batch is not None
            got = [(json.loads(e.payload)["message_id"], e.attempt) for e in batch.entries]
            assert got == [("m1", 2), ("m2", 2), ("m3", 1)]

    async def test_a_batch_parks_its_key(self, state: Inbox) -> None:
        await accept(state, ev(1), ev(2), ev(3), with_entry=False)
        async with state.inbox_worker(lock_ttl=5.0, with_entry=False) as worker:
            grant = await self.taken(worker)
            batch = await state.inbox_take(KEY, grant.owner, limit=2)
            assert batch is not None
            ids = [e.id for e in batch.entries]
            parked = await state.inbox_take(
                KEY, grant.owner, done=ids, dead="Boom", park=True, limit=5
            )
            assert parked is None
            await nothing_handed(state, worker)
            info = await key_info(state)
            assert info is not None
            assert (info.pending, info.dead, info.parked) == (1, 2, True)
            assert [d.attempts for d in await state.inbox_dead_letters(KEY)] == [1, 1]
            assert await state.inbox_requeue(KEY) == 2
            again = await self.taken(worker)
            batch = await state.inbox_take(KEY, again.owner, limit=5)
            assert batch is not None
            got = [(json.loads(e.payload)["message_id"], e.attempt) for e in batch.entries]
            assert got == [("m1", 1), ("m2", 1), ("m3", 1)]


# -- the dispatcher: EventDispatcher(retry_wait=..., on_poison=...) ---------------------------


class Flaky:
    """A handler that records every delivery (message id, attempt, when) per lock key and fails
    those that ``fail(message id, attempt)`` picks."""

    def __init__(self, fail: Callable[[str, int], bool]) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str, int, float]] = []
        self.failed: asyncio.Event = asyncio.Event()

    async def __call__(self, event: Event, ctx: HandlerContext) -> None:
        message = event.message_id or ""
        now = time.monotonic()
        # (latest: the folded ones count as deliveries of their own, before the one handled)
        covered = [*(e.message_id or "" for e in ctx.skipped), message]
        for each in covered:
            self.calls.append((ctx.lock_key, each, ctx.attempt, now))
        if any(self.fail(each, ctx.attempt) for each in covered):
            self.failed.set()
            raise RuntimeError(f"refused {message} (attempt {ctx.attempt})")

    def deliveries(self, key: str = KEY) -> list[tuple[str, int]]:
        return [(m, a) for k, m, a, _ in self.calls if k == key]

    def when(self, message: str, attempt: int) -> float:
        return next(t for _, m, a, t in self.calls if (m, a) == (message, attempt))


def bot_with(state: State, handler: Flaky, **options: object) -> EventDispatcher:
    options.setdefault("on_lock_conflict", "queue")
    bot = EventDispatcher(state, lock_ttl=5.0, **options)  # type: ignore[arg-type]
    bot.add_handler("*", handler)
    return bot


async def until(predicate: Callable[[], bool], what: str, within: float = SOON) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting after {within} s for: {what}"
        await asyncio.sleep(0.005)


class TestRetryWait:
    async def test_the_wait_holds_nothing_and_the_key_keeps_its_order(self, state: Inbox) -> None:
        handler = Flaky(lambda message, attempt: message == "m1" and attempt == 1)
        bot = bot_with(state, handler, retry_wait=lambda attempt: 1.0, max_attempts=3)
        task = asyncio.create_task(bot.serve())
        try:
            assert await bot.accept(ev(1)) is Outcome.ACCEPTED
            assert await bot.accept(ev(2)) is Outcome.ACCEPTED
            await asyncio.wait_for(handler.failed.wait(), SOON)
            failed_at = time.monotonic()
            # another key is handled during the wait
            assert await bot.accept(ev(3, thread="T2")) is Outcome.ACCEPTED
            await until(lambda: handler.deliveries("slack:C1:T2") == [("m3", 1)], "T2 handled")
            assert handler.deliveries() == [("m1", 1)], "the key's later entry went first"
            # the state says the key waits, and no lock is held
            info = await until_info(state, lambda i: i.retry_in is not None)
            assert info.pending == 2
            assert await state.inspect(KEY) is None
            await until(lambda: len(handler.deliveries()) == 3, "m1 retried, then m2")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries() == [("m1", 1), ("m1", 2), ("m2", 1)]
        retried = handler.when("m1", 2) - failed_at
        assert 1.0 - SKEW <= retried <= 1.0 + 1.0, f"retried {retried:.3f} s after the failure"
        assert bot.stats[Outcome.FAILED] == 1
        assert bot.stats[Outcome.HANDLED] == 3

    async def test_waits_follow_the_attempt_then_dead_letter(self, state: Inbox) -> None:
        handler = Flaky(lambda message, attempt: message == "m1")
        asked: list[int] = []

        def wait(attempt: int) -> float:
            asked.append(attempt)
            return 0.2 * attempt

        bot = bot_with(state, handler, retry_wait=wait, max_attempts=3)
        task = asyncio.create_task(bot.serve())
        try:
            await bot.accept(ev(1))
            await bot.accept(ev(2))
            await until(lambda: ("m2", 1) in handler.deliveries(), "m2 handled after m1 died")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries() == [("m1", 1), ("m1", 2), ("m1", 3), ("m2", 1)]
        assert asked == [1, 2]  # not after the last attempt: that one is dead-lettered
        assert handler.when("m1", 2) - handler.when("m1", 1) >= 0.2 - SKEW
        assert handler.when("m1", 3) - handler.when("m1", 2) >= 0.4 - SKEW
        [letter] = await state.inbox_dead_letters(KEY)
        assert letter.attempts == 3
        assert "refused m1 (attempt 3)" in letter.error
        info = await key_info(state)
        assert info is not None
        assert (info.pending, info.parked, info.retry_in) == (0, False, None)

    async def test_a_wait_under_a_millisecond_retries_in_the_lock(self, state: Inbox) -> None:
        # immediate retries first, then one that waits (the NServiceBus pattern)
        handler = Flaky(lambda message, attempt: attempt < 3)
        bot = bot_with(
            state, handler, retry_wait=lambda attempt: 0.0 if attempt < 2 else 0.3, max_attempts=3
        )
        task = asyncio.create_task(bot.serve())
        try:
            await bot.accept(ev(1))
            await until(lambda: len(handler.deliveries()) == 3, "three deliveries")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries() == [("m1", 1), ("m1", 2), ("m1", 3)]
        assert handler.when("m1", 3) - handler.when("m1", 2) >= 0.3 - SKEW

    async def test_latest_waits_in_the_state_too(self, state: Inbox) -> None:
        handler = Flaky(lambda message, attempt: attempt == 1)
        bot = bot_with(
            state, handler, on_lock_conflict="latest", retry_wait=CHECKED_WAIT, max_attempts=3
        )
        for n in (1, 2):
            assert await bot.accept(ev(n)) is Outcome.ACCEPTED
        task = asyncio.create_task(bot.serve())
        try:
            await asyncio.wait_for(handler.failed.wait(), SOON)
            failed_at = time.monotonic()
            info = await until_info(state, lambda i: i.retry_in is not None)  # the step came
            assert info.pending == 2
            assert await state.inspect(KEY) is None
            await until(lambda: any(a == 2 for _, _, a, _ in handler.calls), "the retry")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        retried = next(t for _, _, a, t in handler.calls if a == 2) - failed_at
        assert CHECKED_WAIT - SKEW <= retried <= CHECKED_WAIT * 1.15 + 1.0
        assert sorted(handler.deliveries()) == [("m1", 1), ("m1", 2), ("m2", 1), ("m2", 2)]

    async def test_another_worker_delivers_the_retry(self, space: Namespace) -> None:
        # The worker that failed the entry stops during the wait (its timer goes with it); a
        # worker on another client, whose rescan runs every lock_ttl / 2, delivers it.
        first, second = open_inbox(space), open_inbox(space)
        handler = Flaky(lambda message, attempt: attempt == 1)
        failing = bot_with(first, handler, retry_wait=lambda attempt: 0.5)
        task = asyncio.create_task(failing.serve())
        try:
            await failing.accept(ev(1))
            await asyncio.wait_for(handler.failed.wait(), SOON)
        finally:
            await failing.aclose()
            await asyncio.wait_for(task, SOON)
        other = Flaky(lambda message, attempt: False)
        worker = EventDispatcher(second, on_lock_conflict="queue", lock_ttl=1.0)
        worker.add_handler("*", other)
        task = asyncio.create_task(worker.serve())
        try:
            await until(lambda: bool(other.calls), "the retry delivered by the other worker")
        finally:
            await worker.aclose()
            await asyncio.wait_for(task, SOON)
            await close_all(first, second)
        assert other.deliveries() == [("m1", 2)]

    def test_bad_options(self) -> None:
        state = MemoryState()
        with pytest.raises(ValueError, match=r"on_poison must be 'dead_letter' or 'park', got 'x'"):
            EventDispatcher(state, on_poison="x")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"retry_wait must be finite seconds >= 0, got -1"):
            EventDispatcher(state, retry_wait=-1)
        with pytest.raises(ValueError, match=r"retry_wait must be finite seconds >= 0, got nan"):
            EventDispatcher(state, retry_wait=math.nan)
        with pytest.raises(TypeError, match=r"retry_wait must be a number .*, got '5'"):
            EventDispatcher(state, retry_wait="5")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"got 'lock_ttl'"):
            EventDispatcher(state, retry_wait="lock_ttl")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"retry_wait must be a number .*, got True"):
            EventDispatcher(state, retry_wait=True)

    async def test_a_retry_wait_that_fails_retries_in_the_lock(
        self, state: Inbox, caplog: pytest.LogCaptureFixture
    ) -> None:
        handler = Flaky(lambda message, attempt: attempt == 1)
        bot = bot_with(state, handler, retry_wait=lambda attempt: -1.0)
        task = asyncio.create_task(bot.serve())
        try:
            await bot.accept(ev(1))
            await until(lambda: len(handler.deliveries()) == 2, "retried")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries() == [("m1", 1), ("m1", 2)]
        assert "retry_wait(1) must return finite seconds >= 0, got -1.0" in caplog.text


class TestPoisonParks:
    async def parked(
        self, state: Inbox, **options: object
    ) -> tuple[Flaky, EventDispatcher, asyncio.Event]:
        """A bot whose handler fails m1 (twice: max_attempts) until the event returned is set,
        with m1 and m2 accepted (it parks the key at m1 once served)."""
        healed = asyncio.Event()
        handler = Flaky(lambda message, attempt: message == "m1" and not healed.is_set())
        bot = bot_with(state, handler, on_poison="park", max_attempts=2, **options)
        await bot.accept(ev(1))
        await bot.accept(ev(2))
        return handler, bot, healed

    async def test_park_then_requeue_restarts_at_attempt_1(self, state: Inbox) -> None:
        handler, bot, healed = await self.parked(state)
        task = asyncio.create_task(bot.serve())
        try:
            info = await until_info(state, lambda i: i.parked)
            assert (info.dead, info.retry_in) == (1, None)
            assert await state.inspect(KEY) is None
            await bot.accept(ev(3))  # accepts go on behind the parked entry
            await asyncio.sleep(QUIET)  # (a key wrongly handed out would be handled by now)
            assert handler.deliveries() == [("m1", 1), ("m1", 2)], "went past a parked entry"
            healed.set()
            assert await state.inbox_requeue(KEY) == 1
            await until(lambda: ("m3", 1) in handler.deliveries(), "all handled")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries()[2:] == [("m1", 1), ("m2", 1), ("m3", 1)]
        assert await state.inbox_dead_letters(KEY) == []

    async def test_latest_parks_the_whole_call(self, state: Inbox) -> None:
        # folded: m1 and m2 are one call; it fails twice, both are dead-lettered and the key
        # parks; requeued, they come back first and fold with m3, at attempt 1
        handler, bot, healed = await self.parked(state, on_lock_conflict="latest")
        task = asyncio.create_task(bot.serve())
        try:
            info = await until_info(state, lambda i: i.parked)
            assert (info.dead, info.pending) == (2, 0)
            await bot.accept(ev(3))
            await asyncio.sleep(QUIET)
            assert len(handler.calls) == 4, "went past a parked call"
            healed.set()
            assert await state.inbox_requeue(KEY) == 2
            await until(lambda: ("m3", 1) in handler.deliveries(), "all handled")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries()[4:] == [("m1", 1), ("m2", 1), ("m3", 1)]

    async def test_park_then_discard_and_the_key_goes_on(self, state: Inbox) -> None:
        handler, bot, _ = await self.parked(state)
        task = asyncio.create_task(bot.serve())
        try:
            await until_info(state, lambda i: i.parked)
            assert handler.deliveries() == [("m1", 1), ("m1", 2)]
            assert await state.inbox_discard(KEY) == 1
            await until(lambda: ("m2", 1) in handler.deliveries(), "m2 handled")
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries() == [("m1", 1), ("m1", 2), ("m2", 1)]
        assert await key_info(state) is None

    async def test_park_after_retries_that_wait(self, state: Inbox) -> None:
        handler, bot, _ = await self.parked(state, retry_wait=0.2)
        task = asyncio.create_task(bot.serve())
        try:
            info = await until_info(state, lambda i: i.parked)
        finally:
            await bot.aclose()
            await asyncio.wait_for(task, SOON)
        assert handler.deliveries() == [("m1", 1), ("m1", 2)]
        assert (info.pending, info.dead) == (1, 1)


async def until_info(state: Inbox, check: Callable[[InboxKey], bool]) -> InboxKey:
    """``KEY``'s listing once ``check`` holds for it (read once more then: a listing need not be
    a snapshot of the key, so the read that saw the change may have seen part of it)."""
    deadline = time.monotonic() + SOON
    while True:
        info = await key_info(state)
        if info is not None and check(info):
            again = await key_info(state)
            assert again is not None
            return again
        assert time.monotonic() < deadline, f"{KEY} is still {info}"
        await asyncio.sleep(0.01)


#: a worker process for the kill test: it fails each entry's first delivery (printing
#: "failed"), with retries that wait 2 s in the state and a long lock TTL (were the lock held
#: during the wait, a takeover would have to wait for it)
WORKER = """
import asyncio, sys
from asynclock import EventDispatcher, state_from_url

async def main():
    state = state_from_url(sys.argv[1], **{sys.argv[2]: sys.argv[3]})
    bot = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=5.0,
                          retry_wait=lambda attempt: 2.0)

    @bot.on("*")
    async def handle(event, ctx):
        if ctx.attempt == 1:
            print("failed", event.message_id, flush=True)
            raise RuntimeError("first delivery refused")

    serving = asyncio.ensure_future(bot.serve())
    print("serving", flush=True)
    await serving

asyncio.run(main())
"""


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", INBOX_SERVER_STATES)
async def test_a_worker_killed_during_the_wait_loses_nothing(backend: Backend) -> None:
    require(backend)
    space = Namespace(backend)
    assert backend.namespace_option is not None
    [(option, prefix)] = backend.options(space.namespace).items()
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        WORKER,
        backend.url,
        option,
        str(prefix),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    state = open_inbox(space)
    try:
        assert worker.stdout is not None
        assert await asyncio.wait_for(worker.stdout.readline(), 60) == b"serving\n"
        producer = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=5.0)
        assert await producer.accept(ev(1)) is Outcome.ACCEPTED
        assert await producer.accept(ev(2)) is Outcome.ACCEPTED
        assert await asyncio.wait_for(worker.stdout.readline(), SOON) == b"failed m1\n"
        failed_at = time.monotonic()
        await until_info(state, lambda i: i.retry_in is not None)  # the wait is in the state
        worker.kill()  # SIGKILL, during the wait: its timer dies with it
        assert await worker.wait() == -signal.SIGKILL
        assert await state.inspect(KEY) is None, "a lock is held during the wait"
        # another worker, whose rescan (every lock_ttl / 2) finds the key once it is due
        handler = Flaky(lambda message, attempt: False)
        other = EventDispatcher(state, on_lock_conflict="queue", lock_ttl=1.0)
        other.add_handler("*", handler)
        other_task = asyncio.create_task(other.serve())
        try:
            await until(lambda: len(handler.deliveries()) == 2, "m1 retried, then m2")
        finally:
            await other.aclose()
            await asyncio.wait_for(other_task, SOON)
        await producer.aclose()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        await state.aclose()
        await purge_namespace(backend, space.namespace)
    assert handler.deliveries() == [("m1", 2), ("m2", 1)]
    retried = handler.when("m1", 2) - failed_at
    assert 2.0 - 0.1 <= retried <= 2.0 + 1.0, f"retried {retried:.3f} s after the failure"


# -- the command line: asynclock inbox (retrying, parked), inbox discard KEY ------------------


def test_the_listing_says_retrying_or_parked() -> None:
    table = format_inbox(
        [
            InboxKey("slack:C1:T1", 2, 3.0, 0, 12.4),
            InboxKey("slack:C1:T2", 1, 1.0, 1, None, True),
            InboxKey("slack:C1:T3", 1, 1.0, 0, 0.0),
            InboxKey("slack:C1:T4", 1, 1.0, 0),
        ]
    )
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert rows["slack:C1:T1"].endswith("retrying in 12s")
    assert rows["slack:C1:T2"].endswith("parked")
    assert rows["slack:C1:T3"].endswith("retry due")
    assert rows["slack:C1:T4"].endswith(" 0")  # nothing to say
    assert table.splitlines()[0].endswith("state")


@pytest.mark.parametrize("backend", INBOX_SERVER_STATES)
async def test_the_command_line_shows_parks_and_discards(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require(backend)
    space = Namespace(backend)
    [(option, prefix)] = backend.options(space.namespace).items()
    assert option == "prefix"
    state = open_inbox(space)
    base = ["--state", backend.url, "--prefix", str(prefix)]

    def run(*argv: str) -> tuple[int, str]:
        code = main(list(argv))
        return code, capsys.readouterr().out

    try:
        await accept(state, ev(1), ev(2))
        async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
            grant = await handed(worker)
            assert grant.entry is not None
            await state.inbox_step(KEY, grant.owner, done=grant.entry.id, dead="Boom", park=True)
            # accepted while this worker waits: a worker that just stopped may still have its
            # BRPOP on the server for a moment, and a grant the server gives it is then left to
            # its reservation (the rescan's business, not this test's)
            await accept(state, ev(3, thread="T2"))
            grant = await handed(worker, "slack:C1:T2")
            assert grant.entry is not None
            await state.inbox_step("slack:C1:T2", grant.owner, done=grant.entry.id, retry_in=60.0)
        code, out = await asyncio.to_thread(run, "inbox", *base)
        assert code == 0
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert rows[KEY].endswith("parked")
        # 60 s, less the time the steps and the command took (whole seconds, rounded)
        waits = re.findall(r"retrying in (\d+)s$", rows["slack:C1:T2"])
        assert waits
        assert 45 <= int(waits[0]) <= 60
        # discard asks first: declined, nothing changes
        monkeypatch.setattr("builtins.input", lambda prompt: "n")
        code, out = await asyncio.to_thread(run, "inbox", *base, "discard", KEY)
        assert (code, out) == (1, "left as it is\n")
        assert len(await state.inbox_dead_letters(KEY)) == 1
        monkeypatch.setattr("builtins.input", lambda prompt: "y")
        code, out = await asyncio.to_thread(run, "inbox", *base, "discard", KEY)
        assert (code, out) == (0, f"discarded 1 dead letter(s) of {KEY!r}\n")
        assert await state.inbox_dead_letters(KEY) == []
        info = await key_info(state)
        assert info is not None
        assert (info.parked, info.pending) == (False, 1)
        code, out = await asyncio.to_thread(run, "inbox", *base, "discard", KEY, "--yes")
        assert (code, out) == (0, f"discarded 0 dead letter(s) of {KEY!r}\n")
        with pytest.raises(SystemExit) as usage:  # argparse's usage error
            await asyncio.to_thread(run, "inbox", *base, "forget", KEY)
        assert usage.value.code == 2
    finally:
        await state.aclose()
        await purge_namespace(backend, space.namespace)
