"""Redis Cluster specifics: routing by slot, sharded pub/sub, SCAN on every master, resharding.

The whole conformance suite runs on the cluster through the matrix (``[redis-cluster]``); these
tests check what the matrix cannot see: *where* things happen. They talk to the masters
directly (``CLUSTER SLOTS``, ``PUBSUB SHARDNUMSUB``, ``CLUSTER SETSLOT``/``MIGRATE``), and the
resharding test moves a slot to another master and back while a lock on it is held and waited
for.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.crc import key_slot
from redis.exceptions import ResponseError

from asynclock import AsyncLock, RedisState, StateUnavailableError, state_from_url
from asynclock.cli._admin import held_locks
from asynclock.state.redis._cluster_inbox import SlotReadySets
from tests._helpers import eventually, reply, token_of
from tests._matrix import REDIS_CLUSTER, purge_namespace, require
from tests.conftest import Target, new_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.redis

Address = tuple[str, int]


async def command(client: Redis, *args: str | int) -> Any:
    """One raw command on one node (redis-py's ``execute_command`` is untyped)."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


def node_client(host: str, port: int) -> Redis:
    """A plain client of one node, with the cluster URL's credentials."""
    parts = urlsplit(REDIS_CLUSTER.url)
    return Redis(host=host, port=port, username=parts.username, password=parts.password)


def _first_node() -> str:
    """``host:port`` of the first node of the cluster URL."""
    return urlsplit(REDIS_CLUSTER.url).netloc.rpartition("@")[2].split(",")[0]


@dataclass
class Cluster:
    """Direct clients of every master, and the slot map as the cluster reports it now."""

    nodes: dict[Address, Redis]
    ids: dict[Address, str]

    async def owner(self, slot: int) -> Address:
        reply = await command(next(iter(self.nodes.values())), "CLUSTER", "SLOTS")
        for start, end, master, *_ in reply:
            if int(start) <= slot <= int(end):
                host = master[0].decode() if isinstance(master[0], bytes) else master[0]
                return (host, int(master[1]))
        raise AssertionError(f"slot {slot} is not served")

    async def move_slot(self, slot: int, target: Address, *, finish: bool = True) -> Address:
        """Start moving ``slot`` to ``target`` (keys and ownership when ``finish``)."""
        source = await self.owner(slot)
        if source == target:
            return source
        src, dst = self.nodes[source], self.nodes[target]
        await command(dst, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.ids[source])
        await command(src, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.ids[target])
        if finish:
            await self.finish_move(slot, source, target)
        return source

    async def finish_move(self, slot: int, source: Address, target: Address) -> None:
        """Migrate the slot's keys from ``source`` to ``target``, then hand the slot over."""
        src = self.nodes[source]
        while keys := await command(src, "CLUSTER", "GETKEYSINSLOT", slot, 100):
            await command(src, "MIGRATE", target[0], target[1], "", 0, 5000, "KEYS", *keys)
        # the importing node first, then the migrating one, then everyone (as redis-cli does)
        order = [target, source, *(a for a in self.nodes if a not in (source, target))]
        for address in order:
            await command(self.nodes[address], "CLUSTER", "SETSLOT", slot, "NODE", self.ids[target])


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    require(REDIS_CLUSTER)
    host, _, port = _first_node().rpartition(":")
    seed = node_client(host, int(port))
    try:
        reply = await command(seed, "CLUSTER", "SLOTS")
    finally:
        await seed.aclose()
    masters = sorted(
        {(m[0].decode() if isinstance(m[0], bytes) else m[0], int(m[1])) for _, _, m, *_ in reply}
    )
    nodes = {address: node_client(*address) for address in masters}
    ids = {}
    for address, client in nodes.items():
        node_id = await command(client, "CLUSTER", "MYID")
        ids[address] = node_id.decode() if isinstance(node_id, bytes) else node_id
    try:
        yield Cluster(nodes, ids)
    finally:
        for client in nodes.values():
            await client.aclose()


@pytest.fixture
async def target() -> AsyncIterator[Target]:
    require(REDIS_CLUSTER)
    made = Target(REDIS_CLUSTER, new_namespace())
    yield made
    await purge_namespace(REDIS_CLUSTER, made.namespace)


@pytest.fixture
async def state(target: Target) -> AsyncIterator[RedisState]:
    opened = target.open()
    assert isinstance(opened, RedisState)
    try:
        yield opened
    finally:
        await opened.aclose()


async def keys_by_master(cluster: Cluster, state: RedisState) -> dict[Address, str]:
    """One lock key per master: its lock key's slot is served by that master."""
    found: dict[Address, str] = {}
    for n in itertools.count():
        key = f"key-{n}"
        owner = await cluster.owner(key_slot(state.lock_key(key).encode()))
        found.setdefault(owner, key)
        if len(found) == len(cluster.nodes):
            return found
    raise AssertionError("unreachable")


def same_slot(slot: int, make: str) -> str:
    """A name ``make.format(n)`` whose key hashes to ``slot``."""
    for n in itertools.count():
        name = make.format(n)
        if key_slot(name.encode()) == slot:
            return name
    raise AssertionError("unreachable")


async def test_a_state_from_url_is_clustered(state: RedisState) -> None:
    assert state.clustered
    assert isinstance(state.client, RedisCluster)
    assert "cluster" in repr(state)


async def test_every_lock_lives_on_the_master_owning_its_slot(
    cluster: Cluster, state: RedisState
) -> None:
    assert len(cluster.nodes) >= 3
    for address, key in (await keys_by_master(cluster, state)).items():
        async with AsyncLock(state, key, ttl=10.0) as lock:
            assert token_of(lock) > 0
            lock_key = state.lock_key(key)
            for other, client in cluster.nodes.items():
                if other == address:
                    assert await client.exists(lock_key) == 1
                else:  # another master would answer MOVED
                    # MovedError on redis-py 6+ ("<slot> <host:port>"), ResponseError on 5.x ("MOVED ...")
                    with pytest.raises(ResponseError, match=r"\d+ [\d.]+:\d+$"):
                        await client.exists(lock_key)


async def test_a_release_wakes_a_waiter_of_another_state_by_sharded_pubsub(
    cluster: Cluster, state: RedisState, target: Target
) -> None:
    async with target.open() as peer:
        for address, key in (await keys_by_master(cluster, state)).items():
            holder = AsyncLock(state, key, ttl=30.0)
            assert await holder.acquire()
            channel = f"{state.lock_key(key)}:released"
            waiter = asyncio.create_task(AsyncLock(peer, key, ttl=30.0).acquire(timeout=10.0))

            async def subscribed(address: Address = address, channel: str = channel) -> bool:
                reply = await command(cluster.nodes[address], "PUBSUB", "SHARDNUMSUB", channel)
                return int(reply[1]) == 1

            await eventually(subscribed, within=5.0)
            for client in cluster.nodes.values():  # never a cluster-wide (broadcast) channel
                assert (await client.pubsub_numsub(channel))[0][1] == 0
            started = asyncio.get_running_loop().time()
            await holder.release()
            assert await asyncio.wait_for(waiter, 5.0) is True
            # woken by the message, not by the holder's 30 s TTL running out
            assert asyncio.get_running_loop().time() - started < 2.0


async def test_held_locks_scans_every_master(cluster: Cluster, state: RedisState) -> None:
    keys = await keys_by_master(cluster, state)
    locks = [AsyncLock(state, key, ttl=20.0) for key in keys.values()]
    for lock in locks:
        assert await lock.acquire()
    listed = await held_locks(state)
    assert sorted(info.key for info in listed) == sorted(keys.values())
    assert {info.key: info.token for info in listed} == {lock.key: lock.token for lock in locks}
    for lock in locks:
        await lock.release()
    assert await held_locks(state) == []


async def test_a_slot_moving_to_another_master_is_followed(
    cluster: Cluster, state: RedisState, target: Target
) -> None:
    key = "resharded"
    slot = key_slot(state.lock_key(key).encode())
    home = await cluster.owner(slot)
    away = next(a for a in cluster.nodes if a != home)
    dedupe_id = same_slot(slot, f"{state.prefix}dedupe:{{}}").removeprefix(state.prefix)
    async with target.open() as peer:
        assert (await state.acquire(key, "holder", 30.0)).token  # the State API: any task
        waiter = asyncio.create_task(AsyncLock(peer, key, ttl=30.0).acquire(timeout=20.0))
        await asyncio.sleep(0.2)  # the waiter subscribed on the slot's master
        moving = False
        try:
            await cluster.move_slot(slot, away, finish=False)
            moving = True
            # mid-migration: a key not moved yet answers ASK on the old master; followed
            assert await state.dedupe_add(dedupe_id, 30.0) is True
            # a script whose keys are split between the masters gets TRYAGAIN until the
            # slot settles: the release waits for that, then follows the MOVED
            release = asyncio.create_task(state.release(key, "holder"))
            await asyncio.sleep(0.3)
            assert not release.done()
            await cluster.finish_move(slot, home, away)
            moving = False
            assert (await asyncio.wait_for(release, 5.0)).owned
            started = asyncio.get_running_loop().time()
            # the waiter's subscription moved with the slot, and it got the lock
            assert await asyncio.wait_for(waiter, 10.0) is True
            assert asyncio.get_running_loop().time() - started < 5.0
            assert await cluster.owner(slot) == away
            # the lock key (with its fencing token) lives on the new master now
            assert await cluster.nodes[away].exists(state.lock_key(key)) == 1
            assert await state.dedupe_add(dedupe_id, 30.0) is False  # the record moved too
        finally:
            if moving:
                await cluster.finish_move(slot, home, away)
            await cluster.move_slot(slot, home)
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(BaseException):
                await waiter
    # and back home: still served
    async with AsyncLock(state, key, ttl=5.0, timeout=31.0) as lock:
        assert token_of(lock) > 0


async def test_a_script_missing_from_a_node_is_loaded_on_that_node(
    cluster: Cluster, state: RedisState
) -> None:
    keys = await keys_by_master(cluster, state)
    for key in keys.values():  # every script in every node's cache
        async with AsyncLock(state, key, ttl=5.0):
            pass
    for client in cluster.nodes.values():
        await client.script_flush()
    for key in keys.values():
        async with AsyncLock(state, key, ttl=5.0) as lock:
            assert await lock.locked()
            await lock.extend()


async def test_a_given_cluster_client_is_used_and_not_closed(target: Target) -> None:
    host, _, port = _first_node().rpartition(":")
    parts = urlsplit(REDIS_CLUSTER.url)
    client = RedisCluster(
        host=host, port=int(port), username=parts.username, password=parts.password
    )
    try:
        async with RedisState(client, **target.options) as state:  # type: ignore[arg-type]
            assert state.clustered
            async with AsyncLock(state, "given", ttl=5.0) as lock:
                assert token_of(lock) > 0
        assert await client.ping()  # still open
    finally:
        await client.aclose()


async def test_any_reachable_startup_node_will_do(target: Target) -> None:
    if "@" in urlsplit(REDIS_CLUSTER.url).netloc:
        pytest.skip("the URL has credentials")
    url = f"redis+cluster://127.0.0.1:1,{_first_node()}"
    async with (
        state_from_url(url, connect_timeout=1.0, **target.options) as state,
        AsyncLock(state, "startup", ttl=5.0) as lock,
    ):
        assert token_of(lock) > 0


async def test_an_unreachable_cluster_is_unavailable() -> None:
    async with state_from_url(
        "redis+cluster://127.0.0.1:1", connect_timeout=1.0, op_timeout=2.0
    ) as state:
        with pytest.raises(StateUnavailableError):
            await AsyncLock(state, "nowhere", ttl=5.0).acquire(blocking=False)


async def test_keys_starting_with_a_brace_keep_one_slot_and_their_names(
    state: RedisState,
) -> None:
    keys = ["}starts", "{opens", "{}", "}{", "plain}brace"]
    locks = [AsyncLock(state, key, ttl=20.0) for key in keys]
    for lock in locks:
        assert await lock.acquire(blocking=False)
        lock_key = state.lock_key(lock.key)
        assert key_slot(lock_key.encode()) == key_slot(f"{lock_key}:released".encode())
    assert sorted(info.key for info in await held_locks(state)) == sorted(keys)
    assert sorted(info.key for info in await held_locks(state, "}*")) == ["}starts", "}{"]
    for lock in locks:
        await lock.release()


async def test_an_inbox_follows_its_slot_to_another_master(
    cluster: Cluster, state: RedisState
) -> None:
    # The inbox, its slot's set of keys with work and the set's listing mark share the key's
    # slot, so they move together; reads that reach the old master are redirected.
    key = "inbox-resharded"
    lock_key = state.lock_key(key)
    slot = key_slot(lock_key.encode())
    home = await cluster.owner(slot)
    away = next(a for a in cluster.nodes if a != home)
    assert isinstance(state._ready, SlotReadySets)
    shard = state._ready.directory_of(slot)
    directory = cluster.nodes[await cluster.owner(key_slot(shard.encode()))]

    async def accept(n: int) -> str:
        answer = await state.inbox_accept(
            key, f'{{"n": {n}}}', claim=None, claim_ttl=30.0, max_pending=10
        )
        return answer.status

    assert await accept(1) == "accepted"
    assert await state._ready.keys() == [key]  # the state knows the slot's master now
    listed = await reply(directory.hget(shard, str(slot)))
    try:
        await cluster.move_slot(slot, away)
        assert await state._ready.keys() == [key]  # the set's read answered MOVED: followed
        assert await accept(2) == "accepted"
        assert await reply(directory.hget(shard, str(slot))) == listed  # not listed again: it moved
        assert await reply(cluster.nodes[away].llen(f"{lock_key}:inbox")) == 2
        # the first accept handed the key out (its lock reserved for the grant): drain it as the
        # worker that takes the grant would
        holder = await state.inspect(key)
        assert holder is not None
        taken = []
        entry = await state.inbox_step(key, holder.owner, take=False)
        while entry is not None:
            taken.append(entry.payload)
            entry = await state.inbox_step(key, holder.owner, done=entry.id)
        assert taken == ['{"n": 1}', '{"n": 2}']
        assert await state._ready.keys() == []
    finally:
        await cluster.move_slot(slot, home)
