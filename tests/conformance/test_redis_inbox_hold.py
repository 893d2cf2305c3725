"""The Redis inbox's holds (``_hold.lua``): where a key that waits for a retry, or is parked, is kept.

The behaviour is the conformance suite's (``test_inbox_retry.py``, every backend). These tests
look at the layout, on one server and on a cluster: a parked key is in no set of keys with work,
so no rescan reads it however many keys are parked; a waiting key stays in its set with its due
time as its score; and nothing of a key is left once its work is done, whatever waited or parked
on the way.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from asynclock import RedisState
from asynclock.state._protocol import InboxState
from tests._matrix import MEMORY, REDIS, REDIS_CLUSTER, Backend, _param, purge_namespace, require
from tests.conformance.test_inbox import Namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock.state._protocol import InboxEntry

pytestmark = pytest.mark.redis


@pytest.fixture(params=[_param(REDIS), _param(REDIS_CLUSTER)])
async def state(request: pytest.FixtureRequest) -> AsyncIterator[RedisState]:
    backend: Backend = request.param
    require(backend)
    space = Namespace(backend)
    opened = space.open()
    assert isinstance(opened, RedisState)
    try:
        yield opened
    finally:
        await opened.aclose()
        await purge_namespace(backend, space.namespace)


async def accept(state: RedisState, key: str, n: int) -> None:
    accepted = await state.inbox_accept(
        key, f'{{"n": {n}}}', claim=None, claim_ttl=60.0, max_pending=100
    )
    assert accepted.status == "accepted"


async def head(state: RedisState, key: str) -> tuple[str, InboxEntry]:
    """The owner the accept's hand-out reserved ``key`` for, and the head it delivers."""
    holder = await state.inspect(key)
    assert holder is not None
    entry = await state.inbox_step(key, holder.owner)
    assert entry is not None
    return holder.owner, entry


async def park(state: RedisState, key: str) -> None:
    owner, entry = await head(state, key)
    assert await state.inbox_step(key, owner, done=entry.id, dead="boom", park=True) is None


async def inbox_keys_of(state: RedisState, key: str) -> list[str]:
    """The names of ``key``'s inbox keys in the server (every master)."""
    return sorted([name async for name in state._scan(f"{state.lock_key(key)}:inbox*")])


async def drain(state: RedisState, key: str, owner: str) -> None:
    entry = await state.inbox_step(key, owner)
    while entry is not None:
        entry = await state.inbox_step(key, owner, done=entry.id)


async def test_parked_keys_are_read_by_no_rescan(state: RedisState) -> None:
    # 30 parked keys, each with an entry waiting behind its dead letter: the sets of keys with
    # work hold none of them, so a rescan's cost does not grow with the parked keys
    keys = [f"slack:C1:parked{n}" for n in range(30)]
    for key in keys:
        await accept(state, key, 1)
        await park(state, key)
        await accept(state, key, 2)
    assert await state._ready.keys() == []
    assert await state.inbox_ready() == []
    infos = await state.inbox_keys()
    assert sorted(i.key for i in infos) == sorted(keys)
    assert {(i.pending, i.dead, i.parked, i.retry_in) for i in infos} == {(1, 1, True, None)}
    # unparked, each is listed again and handed out
    for key in keys:
        assert await state.inbox_discard(key) == 1
    assert sorted(await state._ready.keys()) == sorted(keys)
    for key in keys:
        holder = await state.inspect(key)
        assert holder is not None
        assert holder.owner.startswith("inbox-handout:")


async def test_a_waiting_key_is_scored_by_its_due_time(state: RedisState) -> None:
    early, late = "slack:C1:early", "slack:C1:late"
    await accept(state, early, 1)
    await accept(state, late, 1)
    owner, entry = await head(state, early)
    assert await state.inbox_step(early, owner, done=entry.id, retry_in=60.0) is None
    # the waiting key is kept (a rescan finds it once due), after the other, and left out of
    # the keys that are due
    assert await state._ready.keys() == [late, early]
    assert await state._ready.keys(due=True) == [late]
    assert await state.inspect(early) is None  # no lock held while it waits


async def test_nothing_of_a_key_is_left_after_a_wait_and_a_park(state: RedisState) -> None:
    key = "slack:C1:cycle"
    await accept(state, key, 1)
    await accept(state, key, 2)
    owner, entry = await head(state, key)
    assert await state.inbox_step(key, owner, done=entry.id, retry_in=0.2) is None
    assert f"{state.lock_key(key)}:inbox:hold" in await inbox_keys_of(state, key)
    await asyncio.sleep(0.25)  # the due time, by the server's clock
    async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
        grant = await worker.take(key)
    assert grant is not None
    assert grant.entry is not None
    assert grant.entry.id == entry.id
    # the head delivered again, then poisoned: the key parks with its second entry behind it
    parked = await state.inbox_step(key, grant.owner, done=entry.id, dead="boom", park=True)
    assert parked is None
    assert await state.inbox_requeue(key) == 1
    holder = await state.inspect(key)
    assert holder is not None
    await drain(state, key, holder.owner)
    assert await state.inbox_keys() == []
    assert await inbox_keys_of(state, key) == []
    # a park with nothing behind it, then a discard: nothing left either
    await accept(state, key, 3)
    await park(state, key)
    assert await state.inbox_discard(key) == 1
    assert await inbox_keys_of(state, key) == []
    assert await state.inbox_keys() == []


@pytest.fixture(params=[_param(MEMORY), _param(REDIS), _param(REDIS_CLUSTER)])
async def any_state(request: pytest.FixtureRequest) -> AsyncIterator[InboxState]:
    """Memory too: the reference the Redis layout must agree with."""
    backend: Backend = request.param
    require(backend)
    space = Namespace(backend)
    opened = space.open()
    assert isinstance(opened, InboxState)
    try:
        yield opened
    finally:
        await opened.aclose()
        await purge_namespace(backend, space.namespace)


async def test_a_requeue_during_a_wait_keeps_the_waiting_entrys_attempts(
    any_state: InboxState,
) -> None:
    # m1 dead-lettered (the key goes on), m2 fails once and waits; the requeue puts m1 in front
    # of m2 (m1 starts again at attempt 1) and does not cut the wait short. Once due, m1 comes
    # first, then m2 with the attempt it had: its count is kept while it is not the head.
    state = any_state
    key = "slack:C1:kept"
    for n in (1, 2):
        accepted = await state.inbox_accept(
            key, f"m{n}", claim=None, claim_ttl=60.0, max_pending=9, with_entry=True
        )
        assert accepted.status == "accepted"
    async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
        grant = await worker.next(5.0)
        assert grant is not None
        assert grant.entry is not None
        assert (grant.entry.payload, grant.entry.attempt) == ("m1", 1)
        second = await state.inbox_step(key, grant.owner, done=grant.entry.id, dead="boom")
        assert second is not None
        assert (second.payload, second.attempt) == ("m2", 1)
        assert await state.inbox_step(key, grant.owner, done=second.id, retry_in=0.3) is None
        assert await state.inbox_requeue(key) == 1
        [info] = await state.inbox_keys()
        assert (info.pending, info.dead, info.parked) == (2, 0, False)
        assert info.retry_in is not None
        assert await worker.take(key) is None  # still waiting
        await asyncio.sleep(info.retry_in + 0.05)  # the due time, by the state's clock
        taken = await worker.take(key)
        assert taken is not None
        assert taken.entry is not None
        delivered = [(taken.entry.payload, taken.entry.attempt)]
        entry: InboxEntry | None = taken.entry
        while entry is not None:
            entry = await state.inbox_step(key, taken.owner, done=entry.id)
            if entry is not None:
                delivered.append((entry.payload, entry.attempt))
    assert delivered == [("m1", 1), ("m2", 2)]
