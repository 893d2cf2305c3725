"""Inbox retries that wait, and poison that parks its key (SPEC section 9, INBOX_PROTOCOL.md).

State-level first (every rule of ``inbox_step(retry_in=..., park=...)``, ``inbox_take``,
``inbox_requeue``, ``inbox_discard`` and ``inbox_keys``), on every backend with the inbox
(``INBOX_STATES``); two clients of one namespace stand in for two worker processes.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import TYPE_CHECKING, Protocol

import pytest

from asynclock import LockNotOwnedError
from asynclock._inbox import encode
from asynclock.state._protocol import InboxState, State
from tests._matrix import INBOX_STATES, Backend, purge_namespace, require
from tests.conformance.test_inbox import SOON, Namespace, close_all, ev

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import Event
    from asynclock.state._protocol import InboxGrant, InboxKey, InboxWorker

KEY = "slack:C1:T1"
#: how long an absent hand-out is waited for (a pushed one takes about a millisecond)
QUIET = 0.3
#: how far the state's clock (a server's) and this process's may disagree about a duration
SKEW = 0.05


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
            async with first.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
                grant = await handed(worker)
                assert grant.entry is not None
                await first.inbox_step(KEY, grant.owner, done=grant.entry.id, retry_in=0.5)
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
            left = await state.inbox_take(KEY, grant.owner, done=ids, retry_in=0.6, limit=5)
            assert left is None
            info = await key_info(state)
            assert info is not None
            assert (info.pending, info.dead, info.parked) == (2, 0, False)
            assert info.retry_in is not None
            assert 0.0 < info.retry_in <= 0.6
            assert await accept(state, ev(3), with_entry=False) == ["accepted"]
            await nothing_handed(state, worker)
            waited = await due(state)
            assert waited >= 0.6 - QUIET * 2 - SKEW  # (nothing_handed waited some of it)
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
