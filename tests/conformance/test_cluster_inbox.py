"""The durable inbox on Redis Cluster: *where* its keys with work live (``_cluster_inbox.py``).

The inbox's behaviour runs on the cluster through the matrix (``test_inbox.py``,
``test_inbox_processes.py`` ``[redis-cluster]``). These tests look at the layout with direct
clients: one set of keys with work per hash slot, spread over every master; the directory of slots
with work, listed once per slot and pruned only when a slot's set is empty, fenced by generation;
and ``asynclock inbox`` over a ``redis+cluster://`` URL.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from asynclock import RedisState, StateUnavailableError, state_from_url
from asynclock.state.redis._cluster_inbox import BLOCK, SlotReadySets, slot_tag
from tests._helpers import reply
from tests._matrix import REDIS_CLUSTER, purge_namespace, require
from tests._server_work import RedisMonitor, with_client_name
from tests.conformance.test_cluster import node_client
from tests.conftest import new_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from asynclock.state._protocol import InboxEntry, InboxGrant

pytestmark = pytest.mark.redis

SCRIPTS = resources.files("asynclock.state.redis")


class Inbox:
    """A clustered state of a fresh namespace, its ready index, and a plain cluster client."""

    def __init__(self, state: RedisState, raw: RedisCluster, client_name: str) -> None:
        self.state = state
        self.raw = raw
        self.client_name = client_name  # of the state's connections (to count its requests)
        assert isinstance(state._ready, SlotReadySets)
        self.index = state._ready

    def slot(self, key: str) -> int:
        return key_slot(self.state.lock_key(key).encode())

    def directory(self, key: str) -> str:
        """The directory hash that lists ``key``'s slot (its block's)."""
        return self.index.directory_of(self.slot(key))

    async def listed(self, key: str) -> str | None:
        """The generation under which the directory lists ``key``'s slot, if it does."""
        value = await reply(self.raw.hget(self.directory(key), str(self.slot(key))))
        return _text(value) if value is not None else None

    def master_of(self, name: str) -> str:
        node = self.raw.get_node_from_key(name)
        assert node is not None
        return str(node.name)

    def master_address(self, name: str) -> tuple[str, int]:
        node = self.raw.get_node_from_key(name)
        assert node is not None
        return str(node.host), int(node.port)

    async def accept(self, key: str, n: int = 0, *, max_pending: int = 100) -> str:
        reply = await self.state.inbox_accept(
            key, f'{{"n": {n}}}', claim=None, claim_ttl=60.0, max_pending=max_pending
        )
        return reply.status

    async def drain(self, key: str, *, dead: str | None = None) -> None:
        """Take every entry of ``key`` as its lock holder (dead-lettering them with ``dead``)."""
        owner = "test-drainer"
        if (await self.state.acquire(key, owner, 10.0)).token is None:
            # the accept handed the key out (its lock reserved for a grant on the lane): drain it
            # as the worker that takes the grant would
            holder = await self.state.inspect(key)
            assert holder is not None
            owner = holder.owner
        entry = await self.state.inbox_step(key, owner)
        while entry is not None:
            entry = await self.state.inbox_step(key, owner, done=entry.id, dead=dead)


@pytest.fixture
async def inbox() -> AsyncIterator[Inbox]:
    require(REDIS_CLUSTER)
    namespace = new_namespace()
    client_name = f"ci{namespace[-12:]}"
    url = with_client_name(REDIS_CLUSTER.url, client_name)
    state = state_from_url(url, **REDIS_CLUSTER.options(namespace))
    assert isinstance(state, RedisState)
    raw = RedisCluster.from_url(REDIS_CLUSTER.url.replace("redis+cluster://", "redis://", 1))
    try:
        yield Inbox(state, raw, client_name)
    finally:
        await state.aclose()
        await raw.aclose()
        await purge_namespace(REDIS_CLUSTER, namespace)


def test_every_slot_has_a_tag_that_hashes_to_it() -> None:
    assert [key_slot(slot_tag(slot).encode()) for slot in range(16384)] == list(range(16384))


async def test_the_keys_with_work_spread_over_slots_and_masters(inbox: Inbox) -> None:
    keys = [f"slack:C1:T{n}" for n in range(300)]
    await asyncio.gather(*(inbox.accept(key) for key in keys))
    assert sorted(await inbox.index.keys()) == sorted(keys)
    # each key joined the set of its own lock's slot, and each set holds only a few keys
    sets = Counter(inbox.state._ready.ready_key(inbox.state.lock_key(key)) for key in keys)
    for name, members in sets.items():
        assert await inbox.raw.zcard(name) == members
    assert {key_slot(name.encode()) for name in sets} == {inbox.slot(key) for key in keys}
    assert len(sets) > 280
    assert max(sets.values()) <= 3
    # over every master, about evenly
    masters = Counter(inbox.master_of(name) for name in sets)
    assert len(masters) == len(inbox.raw.get_primaries()) == 3
    assert min(masters.values()) > len(sets) / 5
    # the directory lists exactly those slots, its hashes on every master too
    listed = set()
    for directory in inbox.index.directory:
        listed |= {int(slot) for slot in await reply(inbox.raw.hkeys(directory))}
    assert listed == {inbox.slot(key) for key in keys}
    assert len({inbox.master_of(directory) for directory in inbox.index.directory}) == 3
    # none of it is taken for a lock by the operators' listing: the locks it shows are the
    # keys' own, each reserved for the grant its first accept handed out
    held = [info async for info in inbox.state.held_locks()]
    assert sorted(info.key for info in held) == sorted(keys)
    assert all(info.owner.startswith("inbox-handout:") for info in held)


async def test_a_slot_is_listed_once_and_pruned_only_when_empty(inbox: Inbox) -> None:
    key = "slack:C1:listed"
    assert await inbox.listed(key) is None
    assert await inbox.accept(key, 1) == "accepted"
    first = await inbox.listed(key)
    assert first is not None
    assert await inbox.accept(key, 2) == "accepted"
    assert await inbox.listed(key) == first  # listed once, not per accept
    assert await inbox.index.prune({inbox.slot(key)}) == 0  # it has work: it stays
    assert await inbox.listed(key) == first
    await inbox.drain(key)
    assert await inbox.index.keys() == []
    assert await inbox.index.prune({inbox.slot(key)}) == 1
    assert await inbox.listed(key) is None
    # the next accept lists the slot again, under a new generation, and a rescan finds the key
    assert await inbox.accept(key, 3) == "accepted"
    again = await inbox.listed(key)
    assert again not in (None, first)
    assert await inbox.index.keys() == [key]


def _key_where(inbox: Inbox, tag: str, same_master: bool) -> str | None:
    """A key whose slot's directory hash is (``same_master``) or is not on its own master."""
    for n in range(20_000):
        key = f"slack:C1:{tag}{n}"
        here = inbox.master_of(inbox.state.lock_key(key)) == inbox.master_of(inbox.directory(key))
        if here == same_master:
            return key
    return None


async def _warm(inbox: Inbox, key: str) -> list[str]:
    """Accept a key in another slot on the master of ``key`` and on that of its directory hash
    (the slot map read, connections opened, the script loaded); returns those keys."""
    masters = {inbox.master_of(inbox.state.lock_key(key)), inbox.master_of(inbox.directory(key))}
    warm: dict[str, str] = {}
    for candidate in (f"slack:C1:warm{n}" for n in range(20_000)):
        master = inbox.master_of(inbox.state.lock_key(candidate))
        if master in masters and inbox.slot(candidate) != inbox.slot(key):
            warm.setdefault(master, candidate)
            if len(warm) == len(masters):
                break
    for candidate in warm.values():
        assert await inbox.accept(candidate) == "accepted"
    return list(warm.values())


async def _requests(inbox: Inbox, work: Awaitable[object]) -> list[str]:
    """The commands the state sent for ``work`` (``MONITOR`` on every master)."""
    async with RedisMonitor(REDIS_CLUSTER.url, inbox.client_name) as monitor:
        await work
        await monitor.sync()
    return [request.what for request in monitor.record.requests]


async def test_the_first_accept_into_a_slot_lists_it_in_the_same_request(inbox: Inbox) -> None:
    # The slot's directory hash (its block's) is on the slot's master: the accept script writes
    # the listing there itself, one round trip as every later accept.
    await inbox.raw.initialize()
    key = _key_where(inbox, "here", same_master=True)
    assert key is not None
    warm = await _warm(inbox, key)
    assert await inbox.listed(key) is None
    assert await _requests(inbox, inbox.accept(key)) == ["EVALSHA"]
    generation = await inbox.listed(key)
    assert generation is not None
    mark = await reply(inbox.raw.get(inbox.index.listed_key(inbox.state.lock_key(key))))
    assert _text(mark) == generation
    assert sorted(await inbox.index.keys()) == sorted([*warm, key])
    # emptied, pruned, and listed again in one request, under a new generation
    await inbox.drain(key)
    assert await inbox.index.prune({inbox.slot(key)}) == 1
    assert await _requests(inbox, inbox.accept(key, 2)) == ["EVALSHA"]
    assert await inbox.listed(key) not in (None, generation)


async def test_a_slot_whose_directory_hash_is_on_another_master_is_listed_through_the_cluster(
    inbox: Inbox,
) -> None:
    # Where a range boundary cuts a block, the script cannot reach the block's hash: it answers
    # 'unlisted', the client writes the generation, and the accept runs again with it.
    await inbox.raw.initialize()
    key = _key_where(inbox, "edge", same_master=False)
    if key is None:
        pytest.skip("every block of slots is on one master (the ranges end at block ends)")
    warm = await _warm(inbox, key)
    assert await _requests(inbox, inbox.accept(key)) == ["EVALSHA", "HSET", "EVALSHA"]
    generation = await inbox.listed(key)
    assert generation is not None
    mark = await reply(inbox.raw.get(inbox.index.listed_key(inbox.state.lock_key(key))))
    assert _text(mark) == generation
    assert sorted(await inbox.index.keys()) == sorted([*warm, key])
    assert await _requests(inbox, inbox.accept(key, 2)) == ["EVALSHA"]  # listed: one request
    await inbox.drain(key)
    assert await inbox.index.prune({inbox.slot(key)}) == 1
    assert await inbox.listed(key) is None


async def test_a_rescan_reads_the_directory_with_one_request_per_master(inbox: Inbox) -> None:
    # The directory is 256 hashes (one per block of 64 slots), a master holding those of its
    # slots: one script per master reads them. A hash not where the slot map says (the slots
    # moved since it was read) is read alone.
    await inbox.raw.initialize()
    key = _key_where(inbox, "rescan", same_master=True)
    assert key is not None
    await _warm(inbox, key)
    assert await inbox.accept(key) == "accepted"
    index = inbox.index
    for _ in range(2):  # the script loaded on every master, the listed slots known, and the
        await index.keys()  # connections open that read the directory and the sets at once
    masters = len(inbox.raw.get_primaries())
    # the directory, and the known slots' sets (the key's and the warm-up keys')
    expected = ["EVALSHA"] * (masters + len(await index.keys()))
    assert await _requests(inbox, index.keys()) == expected
    # a stale slot map: the block hashes believed on one master are read where they are
    listed = {inbox.slot(k) for k in await index.keys()}
    router = inbox.state._transport.router  # type: ignore[attr-defined]
    real = router._slots[:]
    wrong = next(a for a in router.masters if a != real[0])
    try:
        router._slots[0:BLOCK] = [wrong] * BLOCK  # slot 0's block (hash and slots) "on" another
        router._stale = False
        assert await index.listed() == listed
        router._slots[0:BLOCK] = [wrong] * BLOCK
        router._stale = False
        assert "HKEYS" in await _requests(inbox, index.listed())
    finally:
        router._slots[:] = real
    assert inbox.slot(key) in await index.listed()


async def test_an_accept_between_the_two_pruning_steps_keeps_its_slot_listed(
    inbox: Inbox,
) -> None:
    key = "slack:C1:race"
    await inbox.accept(key, 1)
    await inbox.drain(key)
    lock_key = inbox.state.lock_key(key)
    index = inbox.index
    # step one of a pruning: the empty set's mark goes, its generation comes back
    unlist = SCRIPTS.joinpath("inbox_unlist.lua").read_text()
    taken = _text(
        await reply(
            inbox.raw.eval(unlist, 2, index.ready_key(lock_key), index.listed_key(lock_key))
        )
    )
    assert taken == await inbox.listed(key)
    # meanwhile an accept finds no mark: it lists the slot again (a new generation) and appends
    assert await inbox.accept(key, 2) == "accepted"
    # step two with the old generation must not take the slot off the directory
    forget = SCRIPTS.joinpath("inbox_forget_slot.lua").read_text()
    directory = inbox.directory(key)
    forgotten = await reply(inbox.raw.eval(forget, 1, directory, str(inbox.slot(key)), taken))
    assert int(forgotten) == 0
    assert await inbox.listed(key) not in (None, taken)
    assert await inbox.index.keys() == [key]


async def test_two_first_accepts_of_one_slot_leave_the_directory_with_the_marks_generation(
    inbox: Inbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both find the slot unlisted and each writes a fresh generation into the directory before
    # either comes back to its script: only the first script sets the mark, and the directory
    # then holds the other's generation. The second script sends its accept back to write the
    # mark's: the directory ends with the generation a pruning compares, and the slot can leave
    # it once empty (else its entry stayed forever, read by every rescan). The slot's directory
    # hash is on another master: else the script lists the slot itself, atomically.
    await inbox.raw.initialize()
    key = _key_where(inbox, "twice", same_master=False)
    if key is None:
        pytest.skip("every block of slots is on one master (the ranges end at block ends)")
    index = inbox.index
    lock_key = inbox.state.lock_key(key)
    listing = index.list_for
    both_listed = asyncio.Event()  # asyncio.Barrier is 3.11+; the package supports 3.10
    fresh: list[str] = []

    async def list_for(lock_key: str, generation: str | None = None) -> str:
        written = await listing(lock_key, generation)
        if generation is None:  # a fresh generation: wait until the other wrote its own too
            fresh.append(written)
            if len(fresh) == 2:
                both_listed.set()
            await both_listed.wait()
            if written == fresh[1]:  # the directory holds this one: let the other set the mark
                # the mark is a key of the server: polled (bounded by the test's wait_for)
                while await reply(inbox.raw.get(index.listed_key(lock_key))) is None:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
        return written

    monkeypatch.setattr(index, "list_for", list_for)
    accepted = await asyncio.wait_for(
        asyncio.gather(inbox.accept(key, 1), inbox.accept(key, 2)), 10
    )
    assert list(accepted) == ["accepted", "accepted"]
    mark = _text(await reply(inbox.raw.get(index.listed_key(lock_key))))
    assert await inbox.listed(key) == mark
    await inbox.drain(key)
    assert await index.prune({inbox.slot(key)}) == 1
    assert await inbox.listed(key) is None


async def test_requeue_on_a_pruned_slot_lists_it_again_and_the_cli_shows_it(inbox: Inbox) -> None:
    key = "slack:C1:poison"
    await inbox.accept(key, 1)
    await inbox.drain(key, dead="RuntimeError: boom")
    assert await inbox.index.prune({inbox.slot(key)}) == 1
    command = [sys.executable, "-m", "asynclock", "inbox", "--state", REDIS_CLUSTER.url]
    command += ["--prefix", inbox.state.prefix]
    listing = await _run(*command)
    assert key in listing
    assert "1" in listing.split(key, 1)[1].splitlines()[0]  # its one dead letter
    assert await _run(*command, "requeue", key) == f"requeued 1 dead letter(s) of {key!r}\n"
    assert await inbox.listed(key) is not None
    assert await inbox.index.keys() == [key]
    [info] = await inbox.state.inbox_keys()
    assert (info.key, info.pending, info.dead) == (key, 1, 0)


async def test_a_claim_outside_the_keys_slot_still_dedupes(inbox: Inbox) -> None:
    # A key starting with a brace: its claim name has another hash tag (see RedisState.lock_key)
    key = "}brace"
    lock_key = inbox.state.lock_key(key)
    claims = [f"event:{{{key}}}:slack:m{n}" for n in range(2)]  # as _dedupe/claim.py names them
    assert key_slot((inbox.state.prefix + claims[0]).encode()) != key_slot(lock_key.encode())

    async def accept(claim: str) -> str:
        reply = await inbox.state.inbox_accept(
            key, "{}", claim=claim, claim_ttl=60.0, max_pending=1
        )
        return reply.status

    assert await accept(claims[0]) == "accepted"
    assert await accept(claims[0]) == "duplicate"
    # refused as full: its claim is not kept, so the platform's redelivery is accepted later
    assert await accept(claims[1]) == "full"
    assert await inbox.raw.exists(inbox.state.prefix + claims[1]) == 0
    await inbox.drain(key)
    assert await accept(claims[1]) == "accepted"


async def test_a_worker_waits_on_every_masters_lane_and_comes_back_after_a_kill(
    inbox: Inbox,
) -> None:
    # One lane per master, each in a slot that master serves; a grant for a key of any master
    # reaches the worker, also after the connection it waits on was killed (only this worker's
    # own connection: by the client address it has on that master).
    await inbox.raw.initialize()
    async with inbox.state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
        lanes = await inbox.index.lanes()
        assert len(lanes) == len({inbox.master_of(lane) for lane in lanes}) == 3
        keys = _one_key_per_master(inbox)
        for key in keys:
            assert await inbox.accept(key) == "accepted"
        got = {(await _grant(worker)).key for _ in keys}
        assert got == set(keys)
        lane = lanes[0]
        await _eventually(lambda: lane in worker._connections)
        conn = worker._connections[lane]
        writer = conn._writer
        assert writer is not None
        host, port = writer.get_extra_info("sockname")[:2]
        master = node_client(*inbox.master_address(lane))
        try:
            assert await master.client_kill(f"{host}:{port}")
        finally:
            await master.aclose()
        await _eventually(lambda: worker._connections.get(lane) not in (None, conn))
        lane_master = inbox.master_of(lane)
        again = next(
            k
            for k in _one_key_per_master(inbox, "again")
            if inbox.master_of(inbox.state.lock_key(k)) == lane_master
        )
        assert await inbox.accept(again) == "accepted"
        assert (await _grant(worker)).key == again


async def _grant(worker: object) -> InboxGrant:
    grant = await worker.next(5.0)  # type: ignore[attr-defined]
    assert grant is not None, "no grant within 5 s"
    return grant  # type: ignore[no-any-return]


def _one_key_per_master(inbox: Inbox, tag: str = "k") -> list[str]:
    found: dict[str, str] = {}
    n = 0
    while len(found) < 3:
        key = f"slack:C1:{tag}{n}"
        found.setdefault(inbox.master_of(inbox.state.lock_key(key)), key)
        n += 1
    return list(found.values())


async def _eventually(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "still not true"
        await asyncio.sleep(0.01)


async def test_an_unreachable_cluster_is_unavailable_to_the_inbox() -> None:
    async with state_from_url(
        "redis+cluster://127.0.0.1:1", connect_timeout=1.0, op_timeout=2.0
    ) as state:
        assert isinstance(state, RedisState)
        with pytest.raises(StateUnavailableError):
            await state.inbox_ready()
        with pytest.raises(StateUnavailableError):
            await state.inbox_accept("k", "{}", claim=None, claim_ttl=5.0, max_pending=5)
        with pytest.raises(StateUnavailableError):
            await state.inbox_requeue("k")
        with pytest.raises(StateUnavailableError):
            async with state.inbox_worker(lock_ttl=5.0, with_entry=True):
                pass


async def _run(*command: str) -> str:
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    return out.decode()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _head_as_holder(inbox: Inbox, key: str) -> tuple[str, InboxEntry]:
    """The owner that holds ``key`` (the grant its accept handed out) and the head it delivers."""
    holder = await inbox.state.inspect(key)
    assert holder is not None
    entry = await inbox.state.inbox_step(key, holder.owner)
    assert entry is not None
    return holder.owner, entry


async def test_a_parked_key_leaves_its_slot_which_is_listed_again_when_it_is_unparked(
    inbox: Inbox,
) -> None:
    # A parked key is in no set of keys with work: no rescan reads it, however long it stays
    # parked, and its slot can leave the directory; accepts behind it append without listing the
    # slot. A discard (or requeue) lists the slot again and hands the key out.
    key = "slack:C1:parked"
    assert await inbox.accept(key, 1) == "accepted"
    owner, head = await _head_as_holder(inbox, key)
    assert await inbox.state.inbox_step(key, owner, done=head.id, dead="boom", park=True) is None
    assert await inbox.state.inspect(key) is None  # the lock released in the same step
    assert await inbox.index.keys() == []
    assert await inbox.index.prune({inbox.slot(key)}) == 1
    assert await inbox.listed(key) is None
    assert await inbox.accept(key, 2) == "accepted"
    assert await inbox.accept(key, 3) == "accepted"
    assert await inbox.listed(key) is None  # nothing written to the directory for them
    assert await inbox.index.keys() == []
    assert await inbox.state.inbox_ready() == []
    assert await inbox.state.inspect(key) is None  # and not handed out
    [info] = await inbox.state.inbox_keys()
    assert (info.key, info.pending, info.dead, info.parked, info.retry_in) == (
        key,
        2,
        1,
        True,
        None,
    )
    assert await inbox.state.inbox_discard(key) == 1
    assert await inbox.listed(key) is not None
    assert await inbox.index.keys() == [key]
    holder = await inbox.state.inspect(key)
    assert holder is not None
    assert holder.owner.startswith("inbox-handout:")
    [info] = await inbox.state.inbox_keys()
    assert (info.pending, info.dead, info.parked) == (2, 0, False)


async def test_a_key_waiting_for_a_retry_keeps_its_slot_listed_and_a_rescan_finds_it_due(
    inbox: Inbox,
) -> None:
    # The waiting key stays in its slot's set (its score the due time), so the slot is not
    # pruned and the rescan that comes after the due time finds it; before, it leaves it out.
    key = "slack:C1:waiting"
    assert await inbox.accept(key, 1) == "accepted"
    owner, head = await _head_as_holder(inbox, key)
    assert await inbox.state.inbox_step(key, owner, done=head.id, retry_in=0.5) is None
    assert await inbox.state.inspect(key) is None
    assert await inbox.index.keys() == [key]
    assert await inbox.index.keys(due=True) == []
    assert await inbox.state.inbox_ready() == []
    assert await inbox.index.prune({inbox.slot(key)}) == 0
    assert await inbox.listed(key) is not None
    [info] = await inbox.state.inbox_keys()
    assert info.retry_in is not None
    assert 0.0 < info.retry_in <= 0.5
    await asyncio.sleep(info.retry_in + 0.05)  # the due time, by the server's clock
    assert await inbox.state.inbox_ready() == [key]
    async with inbox.state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
        grant = await worker.take(key)
    assert grant is not None
    assert grant.entry is not None
    # the head that waited, its attempt counted once more (the step kept its count)
    assert (grant.entry.id, grant.entry.attempt) == (head.id, head.attempt + 1)
    [info] = await inbox.state.inbox_keys()
    assert info.retry_in is None  # delivered: the wait is over
