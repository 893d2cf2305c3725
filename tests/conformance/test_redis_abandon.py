"""Redis: what an abandon mark protects, now that a handoff reads it from the lock's value.

``abandon.lua`` leaves two marks: a key of its own, which a late ``acquire.lua`` of the abandoned
owner finds, and, while another owner of the same process holds the lock, an entry in the lock's
value, which the holder's release finds without a command of its own (docs/decisions.md,
"Redis: the abandon mark of a handoff in the lock's value"). These tests pin both, on one
server and on the cluster, and that the entries never leak past the hold or grow without bound.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis, RedisCluster

from asynclock import RedisState
from asynclock._owner import new_owner
from asynclock.state import Release
from tests._helpers import reply
from tests._matrix import REDIS, REDIS_CLUSTER, purge_namespace, require
from tests.conftest import Target, new_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

pytestmark = pytest.mark.redis


def _asynclock_ids() -> tuple[str, str]:
    return new_owner(), new_owner()


def _plain_ids() -> tuple[str, str]:
    return "h", "s"


#: owner ids as AsyncLock makes them ("<host>:<pid>:<task>:<random>", all of this process),
#: and the plain ids a direct caller of the State may use
OWNERS: dict[str, Callable[[], tuple[str, str]]] = {
    "asynclock-ids": _asynclock_ids,
    "plain-ids": _plain_ids,
}


@pytest.fixture(params=[REDIS, REDIS_CLUSTER], ids=["redis", "redis-cluster"])
async def target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    require(request.param)
    made = Target(request.param, new_namespace())
    yield made
    await purge_namespace(request.param, made.namespace)


@pytest.fixture
async def states(target: Target) -> AsyncIterator[tuple[RedisState, RedisState]]:
    """Two clients of one namespace: two processes as far as the lock's waiting flag goes."""
    first, second = target.open(), target.open()
    assert isinstance(first, RedisState)
    assert isinstance(second, RedisState)
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()


@pytest.fixture
async def raw(target: Target) -> AsyncIterator[Redis | RedisCluster]:
    """A plain redis-py client of the target's server (or cluster), to look at lock values."""
    if target.backend is REDIS:
        client: Redis | RedisCluster = Redis.from_url(target.url)
    else:
        first = urlsplit(target.url).netloc.rpartition("@")[2].split(",")[0]
        client = RedisCluster.from_url(f"redis://{first}")
    try:
        yield client
    finally:
        await client.aclose()


async def raw_value(raw: Redis | RedisCluster, state: RedisState, key: str) -> str:
    """The lock key's value as the scripts wrote it ('' when there is none)."""
    value = await reply(raw.get(state.lock_key(key)))
    return value.decode() if isinstance(value, bytes) else ""


@pytest.mark.parametrize("style", sorted(OWNERS))
async def test_a_successor_abandoned_during_the_hold_is_not_handed_the_lock(
    states: tuple[RedisState, RedisState], style: str
) -> None:
    state, _ = states
    holder, successor = OWNERS[style]()
    assert (await state.acquire("k", holder, 10.0)).token is not None
    # the successor's waiter gave up while the release naming it was on the wire, and its
    # abandon reached the server first
    await state.abandon("k", successor)
    assert await state.release("k", holder, successor=successor, ttl=10.0) == Release(
        owned=True, handoff_token=None
    )
    assert await state.inspect("k") is None
    assert (await state.acquire("k", successor, 10.0)).token is None  # its late acquire too


@pytest.mark.parametrize("style", sorted(OWNERS))
async def test_a_mark_names_one_whole_owner(
    states: tuple[RedisState, RedisState], raw: Redis | RedisCluster, style: str
) -> None:
    state, _ = states
    holder, successor = OWNERS[style]()
    assert (await state.acquire("k", holder, 10.0)).token is not None
    await state.abandon("k", successor + "0")  # its id starts with the successor's
    await state.abandon("k", "x" + successor)  # its id ends with it
    handed = await state.release("k", holder, successor=successor, ttl=10.0)
    assert handed.owned
    assert handed.handoff_token is not None
    info = await state.inspect("k")
    assert info is not None
    assert info.owner == successor
    # the entries were the holder's and ended with its hold
    assert "\n" not in await raw_value(raw, state, "k")


async def test_the_entries_survive_the_waiting_flag_coming_and_going(
    states: tuple[RedisState, RedisState],
    raw: Redis | RedisCluster,
) -> None:
    state, other = states
    holder, successor = new_owner(), new_owner()
    assert (await state.acquire("k", holder, 10.0)).token is not None
    await state.abandon("k", successor)
    # a waiter of another state flags the key (acquire.lua rewrites the value), then gives up
    # (abandon.lua withdraws the flag, rewriting it again)
    waiter = new_owner()
    assert (await other.acquire("k", waiter, 10.0, waiting=True)).token is None
    assert "|" in await raw_value(raw, state, "k")
    await other.abandon("k", waiter)
    assert "|" not in await raw_value(raw, state, "k")
    assert await state.release("k", holder, successor=successor, ttl=10.0) == Release(
        owned=True, handoff_token=None
    )


async def test_a_late_waiting_acquire_of_an_abandoned_owner_does_not_flag_the_key(
    states: tuple[RedisState, RedisState],
    raw: Redis | RedisCluster,
) -> None:
    state, other = states
    holder, waiter = new_owner(), new_owner()
    assert (await state.acquire("k", holder, 10.0)).token is not None
    await other.abandon("k", waiter)
    # the abandoned acquire arrives now: refused, and no process is made to give way to it
    assert (await other.acquire("k", waiter, 10.0, waiting=True)).token is None
    assert "|" not in await raw_value(raw, state, "k")
    assert await state.release("k", holder) == Release(owned=True)
    assert (await state.acquire("k", new_owner(), 10.0)).token is not None  # not reserved


async def test_only_owners_of_the_holders_process_are_entered(
    states: tuple[RedisState, RedisState],
    raw: Redis | RedisCluster,
) -> None:
    state, _ = states
    holder = "host-a:1:7f:00"
    assert (await state.acquire("k", holder, 10.0)).token is not None
    # another process's owner is never named successor by this holder: no entry for it
    await state.abandon("k", "host-b:2:7f:01")
    assert await raw_value(raw, state, "k")
    assert "\n" not in await raw_value(raw, state, "k")
    await state.abandon("k", "host-a:1:80:02")
    assert "\nhost-a:1:80:02 " in await raw_value(raw, state, "k")


async def test_expired_entries_are_dropped_when_one_is_added(
    states: tuple[RedisState, RedisState],
    raw: Redis | RedisCluster,
) -> None:
    state, _ = states
    holder, fresh = new_owner(), new_owner()
    token = (await state.acquire("k", holder, 10.0)).token
    assert token is not None
    # an entry whose time ran out long ago (as abandon.lua writes it: "\n<owner> <until ms>")
    stale = f"{token} {holder}\n{new_owner()} 1"
    await reply(raw.set(state.lock_key("k"), stale, keepttl=True))
    await state.abandon("k", fresh)
    value = await raw_value(raw, state, "k")
    assert value.startswith(f"{token} {holder}\n{fresh} ")
    assert value.count("\n") == 1
