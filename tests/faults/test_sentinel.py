"""Redis Sentinel: discovery, a failover under load, and ``replicas=N`` (``WAIT``).

Each test starts its own master, replica and three sentinels on free loopback ports (never the
shared servers) and stops them afterwards. Every await is bounded; races are decided by
conditions the test waits for, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from asynclock import (
    AsyncLock,
    Deduper,
    LockNotOwnedError,
    RedisState,
    Semaphore,
    StateUnavailableError,
)
from asynclock.state import state_from_url
from tests._helpers import reply
from tests.faults._load import Load
from tests.faults._timing import bounded, unexpected_failures, until
from tests.support.reporting import report
from tests.support.servers import RedisProcess, require_binary

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

pytestmark = [pytest.mark.faults, pytest.mark.timeout(90)]

SERVICE = "asynclock-test"
OP_TIMEOUT = 0.5
#: sentinels call the master down after this long without an answer
DOWN_AFTER_MS = 500


@dataclass
class SentinelSet:
    master: RedisProcess
    replica: RedisProcess
    sentinels: list[RedisProcess]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def client(self, port: int) -> Redis:
        return Redis(host="127.0.0.1", port=port, socket_timeout=5.0, socket_connect_timeout=2.0)


def _start_set(binary: str, workdir: Path) -> SentinelSet:
    volatile = ["--save", "", "--appendonly", "no"]
    master = RedisProcess(binary, workdir, *volatile, name="master")
    master.start()
    replica = RedisProcess(
        binary, workdir, *volatile, "--replicaof", "127.0.0.1", str(master.port), name="replica"
    )
    replica.start()
    sentinels = []
    for number in range(3):
        conf = workdir / f"sentinel-{number}.conf"
        conf.write_text(
            f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        # the config file comes first (sentinel rewrites it): redis-server <conf> --sentinel ...
        sentinel = RedisProcess(binary, workdir, str(conf), "--sentinel", name=f"sentinel-{number}")
        sentinel.start()
        sentinels.append(sentinel)
    return SentinelSet(master, replica, sentinels)


async def _ready(topology: SentinelSet) -> bool:
    """Every sentinel knows the replica (in sync) and the two other sentinels."""
    for sentinel in topology.sentinels:
        client = topology.client(sentinel.port)
        try:
            master: Any = await client.sentinel_master(SERVICE)  # type: ignore[no-untyped-call, unused-ignore]
            replicas: Any = await client.sentinel_slaves(SERVICE)  # type: ignore[no-untyped-call, unused-ignore]
        finally:
            await client.aclose()
        if int(master.get("num-other-sentinels", 0)) < 2:
            return False
        if not any(
            int(r["port"]) == topology.replica.port and r.get("master-link-status") == "ok"
            for r in replicas
        ):
            return False
    return True


@pytest.fixture
async def topology() -> AsyncIterator[SentinelSet]:
    binary = require_binary("redis-server", "the sentinel tests start their own servers")
    with tempfile.TemporaryDirectory(prefix="asynclock-sentinel-") as workdir:
        started = await asyncio.to_thread(_start_set, binary, Path(workdir))
        try:
            await until(partial(_ready, started), "the sentinels to see everyone", within=20.0)
            yield started
        finally:
            for process in [*started.sentinels, started.replica, started.master]:
                process.kill()


@pytest.fixture
async def open_state(topology: SentinelSet) -> AsyncIterator[Callable[..., RedisState]]:
    opened: list[RedisState] = []

    def make(**options: Any) -> RedisState:
        options.setdefault("op_timeout", OP_TIMEOUT)
        options.setdefault("connect_timeout", OP_TIMEOUT)
        state = RedisState.from_url(topology.url, **options)
        opened.append(state)
        return state

    yield make
    for state in opened:
        await state.aclose()


async def serve(lock: AsyncLock) -> float:
    assert await lock.acquire()
    acquired_at = time.monotonic()
    await lock.release()
    return acquired_at


async def test_round_trip_through_discovery(
    topology: SentinelSet, open_state: Callable[..., RedisState]
) -> None:
    state = open_state()
    before = state.master
    assert before is None  # nothing connects before the first operation
    lock = AsyncLock(state, "k", ttl=5.0)
    assert await bounded(lock.acquire(blocking=False), "acquire", 5.0)
    assert state.master == ("127.0.0.1", topology.master.port)
    info = await state.inspect("k")
    assert info is not None
    assert info.token == lock.token
    # a blocked waiter of another state is woken by the release (pub/sub on the master)
    other = open_state()
    waiting = asyncio.create_task(serve(AsyncLock(other, "k", ttl=5.0, timeout=10.0)))
    await waiter_subscribed(topology, state, "k")
    released_at = time.monotonic()
    await lock.release()
    acquired_at = await bounded(waiting, "the waiter", 5.0)
    assert acquired_at - released_at < 1.0
    # state_from_url knows the scheme
    by_url = state_from_url(topology.url, op_timeout=OP_TIMEOUT)
    try:
        assert isinstance(by_url, RedisState)
        assert await bounded(Deduper(by_url).first_seen("e1"), "first_seen", 5.0) is True
    finally:
        await by_url.aclose()


async def waiter_subscribed(topology: SentinelSet, state: RedisState, key: str) -> None:
    """Return once a waiter listens on the master for the release of ``state``'s ``key``."""
    admin = topology.client(topology.master.port)
    try:

        async def subscribed() -> bool:
            reply: Any = await admin.pubsub_numsub(f"{state.lock_key(key)}:released")
            return int(reply[0][1]) > 0

        await until(subscribed, "the waiter's SUBSCRIBE", within=3.0)
    finally:
        await admin.aclose()


@pytest.mark.parametrize("url", ["redis+sentinel://127.0.0.1:1", "redis+sentinel:///svc"])
def test_bad_urls(url: str) -> None:
    with pytest.raises(ValueError, match="invalid Redis Sentinel URL"):
        RedisState.from_url(url)


@pytest.mark.parametrize("how", ["kill", "sentinel-failover"])
async def test_failover_mid_load(
    how: str, topology: SentinelSet, open_state: Callable[..., RedisState]
) -> None:
    """The master dies (SIGKILL) or is demoted (``SENTINEL FAILOVER``) under load."""
    a, b = open_state(), open_state()
    load = Load(a)
    await until(load.succeeded_since(0.0, 50), "the load to run", within=5.0)
    # the waiter's fallback attempt comes when the holder's TTL runs out: 6 s from just before
    # the kill (the load started first: its start, slow on a loaded machine, must not use the
    # TTL up) leaves the failover (0.5 s to notice the master down, then the election) time to
    # finish first; an attempt inside the window raises StateUnavailableError, as it must
    holder = AsyncLock(a, "held", ttl=6.0)
    assert await bounded(holder.acquire(), "the holder", 5.0)
    waiting = asyncio.create_task(serve(AsyncLock(b, "held", ttl=3.0, timeout=30.0)))
    await waiter_subscribed(topology, b, "held")

    down_at = time.monotonic()
    if how == "kill":
        await asyncio.to_thread(topology.master.kill)  # SIGKILL: no goodbye to anyone
    else:  # the master becomes a replica of the promoted one (READONLY to writes)
        sentinel = topology.client(topology.sentinels[0].port)
        try:
            assert await sentinel.execute_command(  # type: ignore[no-untyped-call]
                "SENTINEL", "FAILOVER", SERVICE
            )
        finally:
            await sentinel.aclose()

    async def switched() -> bool:
        return (
            a.master == ("127.0.0.1", topology.replica.port)
            and await load.succeeded_since(time.monotonic() - 0.05, 1)()
        )

    await until(switched, "the state to follow the failover", within=30.0)
    switched_at = time.monotonic()
    await until(load.succeeded_since(switched_at, 200), "the load to recover", within=10.0)

    # the waiter blocked before the failover is served on the new master (the holder's lock
    # may or may not have been replicated: at the latest when its TTL runs out)
    acquired_at = await bounded(waiting, "the waiter blocked before the failover", 15.0)
    # the same states work again, first call of every kind
    assert await bounded(Deduper(a).first_seen("after"), "first_seen after", 2.0) is True
    after = AsyncLock(b, "after", ttl=2.0)
    assert await bounded(after.acquire(blocking=False), "acquire after", 2.0)
    await bounded(after.release(), "release after", 2.0)
    with contextlib.suppress(LockNotOwnedError):  # lost if the failover dropped it
        await bounded(holder.release(), "the old holder's release", 2.0)
    await load.stop()

    failed = load.failed
    unexpected = unexpected_failures(failed)
    assert not unexpected, unexpected[:5]
    late = [c for c in failed if c.start >= switched_at]
    assert not late, f"calls failed after the switch: {late[:5]}"
    window = max((c.end for c in failed), default=down_at) - down_at
    report(
        f"sentinel failover ({how})",
        switch=switched_at - down_at,
        last_failure=window,
        waiter_served=acquired_at - down_at,
        failed=str(len(failed)),
        calls=str(len(load.calls)),
    )


async def test_replicas_wait(topology: SentinelSet, open_state: Callable[..., RedisState]) -> None:
    # 2 s: replication on a loopback link takes well under a millisecond, but the suite shares
    # the CI machine with its other workers; the no-replica cases below wait it out twice
    state = open_state(replicas=1, replica_timeout=2.0, op_timeout=5.0)
    replica = topology.client(topology.replica.port)
    try:
        for n in range(20):
            lock = AsyncLock(state, f"w{n}", ttl=5.0)
            assert await bounded(lock.acquire(blocking=False), "acquire", 5.0)
            # on the replica before acquire returned: read it there, no waiting
            assert await replica.exists(state.lock_key(f"w{n}")) == 1
            await bounded(lock.extend(5.0), "extend", 5.0)
            await lock.release()
        # an accepted inbox entry is on the replica before accept returned, too
        accepted = await state.inbox_accept("inbox", "{}", claim=None, claim_ttl=5.0, max_pending=9)
        assert accepted.status == "accepted"
        assert await reply(replica.llen(f"{state.lock_key('inbox')}:inbox")) == 1
        assert state.replica_shortfalls == 0

        # no replica to confirm: an acquire is undone and raises, the key stays free
        await asyncio.to_thread(topology.replica.kill)
        lock = AsyncLock(state, "alone", ttl=5.0)
        with pytest.raises(StateUnavailableError, match="0 of 1 replicas"):
            await bounded(lock.acquire(blocking=False), "acquire without a replica", 5.0)
        assert state.replica_shortfalls == 1
        assert await state.inspect("alone") is None
        with pytest.raises(StateUnavailableError, match="an event for 'inbox' was accepted"):
            await state.inbox_accept("inbox", "{}", claim=None, claim_ttl=5.0, max_pending=9)
        assert state.replica_shortfalls == 2
        plain = open_state()  # replicas=0 still works on the master
        assert await bounded(AsyncLock(plain, "alone", ttl=5.0).acquire(blocking=False), "", 5.0)
    finally:
        await replica.aclose()


async def test_inbox_retry_and_park_through_sentinel(
    topology: SentinelSet, open_state: Callable[..., RedisState]
) -> None:
    """The inbox's retries that wait and parked keys (#30) under Sentinel: the rescan
    (``inbox_ready.lua`` through the sentinel transport) leaves a waiting key out until its due
    time by the master's clock, and a parked key out until it is discarded."""
    state = open_state()

    async def accept() -> None:
        accepted = await state.inbox_accept("k", "{}", claim=None, claim_ttl=5.0, max_pending=9)
        assert accepted.status == "accepted"

    async def head() -> tuple[str, int]:
        holder = await state.inspect("k")
        assert holder is not None
        entry = await state.inbox_step("k", holder.owner)
        assert entry is not None
        return holder.owner, entry.id

    async def listed() -> bool:
        return "k" in await state.inbox_ready()

    await accept()
    owner, entry = await head()
    assert await state.inbox_step("k", owner, done=entry, retry_in=0.3) is None
    assert not await listed()
    waited = await until(listed, "the waiting key to be due", within=5.0)
    assert waited >= 0.3 - 0.1  # (the clocks of this process and the master may differ a bit)
    async with state.inbox_worker(lock_ttl=5.0, with_entry=True) as worker:
        grant = await worker.take("k")
    assert grant is not None
    assert await state.inbox_step("k", grant.owner, done=entry, dead="boom", park=True) is None
    await accept()
    assert not await listed()
    [info] = await state.inbox_keys()
    assert (info.pending, info.dead, info.parked) == (1, 1, True)
    assert await state.inbox_discard("k") == 1
    holder = await state.inspect("k")  # unparked and handed out in the same script
    assert holder is not None
    assert holder.owner.startswith("inbox-handout:")


async def test_semaphore_through_sentinel(
    topology: SentinelSet, open_state: Callable[..., RedisState]
) -> None:
    """Semaphore (#29) under Sentinel: permits on the master, a waiter of another state woken by
    the release's publish, and ``replicas=1`` giving back a permit no replica confirmed."""
    state, other = open_state(), open_state()
    held = [Semaphore(state, "s", limit=2, ttl=5.0) for _ in range(2)]
    for permit in held:
        assert await bounded(permit.acquire(blocking=False), "acquire", 5.0)

    async def wait_turn() -> float:
        async with Semaphore(other, "s", limit=2, ttl=5.0, timeout=10.0):
            return time.monotonic()

    waiting = asyncio.create_task(wait_turn())

    async def queued() -> bool:
        return (await state.semaphore_inspect("s")).waiting == 1

    await until(queued, "the waiter's place", within=5.0)
    released_at = time.monotonic()
    await held[0].release()
    acquired_at = await bounded(waiting, "the waiter", 5.0)
    assert acquired_at - released_at < 1.0
    await held[1].release()

    confirmed = open_state(replicas=1, replica_timeout=2.0, op_timeout=5.0)
    permit = Semaphore(confirmed, "r", limit=1, ttl=5.0)
    assert await bounded(permit.acquire(blocking=False), "acquire with a replica", 5.0)
    await permit.release()
    await asyncio.to_thread(topology.replica.kill)
    alone = Semaphore(confirmed, "r", limit=1, ttl=5.0)
    with pytest.raises(StateUnavailableError, match="0 of 1 replicas"):
        await bounded(alone.acquire(blocking=False), "acquire without a replica", 5.0)
    assert (await state.semaphore_inspect("r")).holders == ()
