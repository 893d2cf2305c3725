"""Redis misbehaves under a live RedisState: restarts, killed connections, pauses, a blackhole.

Every test runs against its own throwaway ``redis-server`` (``conftest.py``), never the shared
one, and bounds every await (``_timing.bounded``): a hang fails the test instead of stalling
the suite. Races are decided by conditions the test waits for (the waiter is subscribed, a
renewal went through, the takeover happened), never by sleeping.

The figures each test prints (``pytest -s -m faults``) are the ones in docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import (
    AsyncLock,
    Deduper,
    LockLostError,
    LockNotOwnedError,
    StateUnavailableError,
)
from tests._helpers import reply as answer
from tests.faults._load import Load
from tests.faults._proxy import FaultProxy
from tests.faults._timing import bounded, unexpected_failures, until
from tests.faults.conftest import OP_TIMEOUT
from tests.support.reporting import report

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio import Redis

    from asynclock import RedisState
    from tests.faults._server import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

#: scheduling slack on a loaded machine, on top of a configured timeout or TTL
MARGIN = 0.3


async def subscribers(admin: Redis, state: RedisState, key: str) -> int:
    """How many connections of the server are subscribed to ``key``'s release channel."""
    channel = f"{state.lock_key(key)}:released"
    reply: Any = await admin.pubsub_numsub(channel)
    return int(reply[0][1])


def subscribed(admin: Redis, state: RedisState, key: str) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await subscribers(admin, state, key) > 0

    return check


async def serve(lock: AsyncLock) -> float:
    """Acquire ``lock`` (blocking), release it; the loop time it was acquired at.

    Runs as the waiter's own task: a lock belongs to the task that acquired it.
    """
    assert await lock.acquire()
    acquired_at = time.monotonic()
    await lock.release()
    return acquired_at


async def assert_unavailable_within(make: Callable[[], Awaitable[object]], what: str) -> float:
    """``make()`` raises StateUnavailableError within op_timeout (+ MARGIN); the seconds taken."""
    start = time.monotonic()
    with pytest.raises(StateUnavailableError):
        await bounded(make(), what, OP_TIMEOUT + 2 * MARGIN + 1.0)
    elapsed = time.monotonic() - start
    assert elapsed <= OP_TIMEOUT + MARGIN, f"{what} took {elapsed:.3f} s to fail"
    return elapsed


class TestRestart:
    """The server is shut down and started again on the same port while locks are in use."""

    HOLD_TTL = 3.0
    LOAD_TASKS = 8

    async def test_restart_mid_load(
        self,
        redis_server: RedisServer,
        admin: Redis,
        open_state: Callable[..., RedisState],
    ) -> None:
        a, b = open_state(), open_state()
        key = "held"
        holder = AsyncLock(a, key, ttl=self.HOLD_TTL)
        assert await holder.acquire()
        # a waiter of another client (its own pub/sub connection), blocked before the restart
        waiter = AsyncLock(b, key, ttl=self.HOLD_TTL, timeout=20.0)
        waiting = asyncio.create_task(serve(waiter))
        await until(subscribed(admin, b, key), "the waiter's SUBSCRIBE", within=2.0)

        load = Load(a, self.LOAD_TASKS)
        await until(load.succeeded_since(0.0, 50), "the load to run", within=5.0)

        # -- the outage ---------------------------------------------------------------------
        down_at = time.monotonic()
        await asyncio.to_thread(redis_server.stop)  # SIGTERM: shutdown, every connection closed
        surfaced = [
            await assert_unavailable_within(lambda: a.inspect("x"), "inspect during the outage"),
            await assert_unavailable_within(
                lambda: Deduper(a).first_seen("during"), "first_seen during the outage"
            ),
            await assert_unavailable_within(
                lambda: AsyncLock(a, "during", ttl=1.0).acquire(blocking=False),
                "acquire during the outage",
            ),
        ]
        await until(load.failed_since(down_at), "the load to see the outage", within=2.0)
        assert not waiting.done(), f"the blocked waiter gave up during the outage: {waiting!r}"
        await asyncio.to_thread(redis_server.start)
        up_at = time.monotonic()

        # -- the waiter blocked before the restart is served (the data, and so the holder's
        # lock, did not survive the restart: at the latest when the holder's TTL runs out) --
        acquired_at = await bounded(waiting, "the waiter blocked before the restart", 10.0)
        served_after = acquired_at - up_at
        assert served_after <= self.HOLD_TTL + MARGIN
        # its client re-subscribed on the new server by itself (the channel lingers 1 s)
        assert await subscribers(admin, b, key) >= 1

        # -- the same states work again, first call of every kind -------------------------
        assert await bounded(Deduper(a).first_seen("after"), "first_seen after", 2.0) is True
        after = AsyncLock(a, "after", ttl=2.0)
        assert await bounded(after.acquire(blocking=False), "acquire after", 2.0)
        await bounded(after.release(), "release after", 2.0)
        with pytest.raises(LockNotOwnedError):  # the holder learns its lock is gone
            await bounded(holder.release(), "the old holder's release", 2.0)

        await until(load.succeeded_since(up_at, 100), "the load to recover", within=5.0)
        await load.stop()

        during = load.failed
        assert during, "the load never saw the outage"
        unexpected = unexpected_failures(during)
        assert not unexpected, unexpected[:5]
        late = [c for c in during if c.start >= up_at]
        assert not late, f"calls failed after the server was back: {late[:5]}"
        longest = max(c.end - c.start for c in load.calls)
        assert longest <= OP_TIMEOUT + MARGIN, f"a call took {longest:.3f} s"
        report(
            "restart",
            outage=up_at - down_at,
            surfaced_max=max(surfaced),
            load_calls=len(load.calls),
            load_failed=len(during),
            failed_call_max=max(c.end - c.start for c in during),
            longest_call=longest,
            waiter_served_after_restart=served_after,
            token_before=holder.token or 0,
            token_after=waiter.token or 0,
        )


class TestClientKill:
    """``CLIENT KILL`` of the pub/sub connection and of the pooled ones, the server staying up."""

    HOLD_TTL = 5.0
    PROMPT = 1.0  # "promptly": far below HOLD_TTL

    @pytest.mark.parametrize("release", ["right-after-kill", "after-resubscribe"])
    async def test_waiter_served_after_kill(
        self,
        admin: Redis,
        open_state: Callable[..., RedisState],
        release: str,
    ) -> None:
        a, b = open_state(), open_state()
        key = "k"
        holder = AsyncLock(a, key, ttl=self.HOLD_TTL)
        assert await holder.acquire()
        waiter = AsyncLock(b, key, ttl=self.HOLD_TTL, timeout=20.0)
        waiting = asyncio.create_task(serve(waiter))
        await until(subscribed(admin, b, key), "the waiter's SUBSCRIBE", within=2.0)

        pubsub: Any = await admin.client_kill_filter(_type="pubsub")
        normal: Any = await admin.client_kill_filter(_type="normal", skipme=True)
        killed_at = time.monotonic()
        assert int(pubsub) >= 1
        assert int(normal) >= 2  # the pooled connections of a and b

        resubscribed = 0.0
        if release == "after-resubscribe":
            resubscribed = await until(
                subscribed(admin, b, key), "the subscriber to come back", within=2.0
            )
            assert not waiting.done(), f"the waiter stopped waiting: {waiting!r}"
        released_at = time.monotonic()
        # the holder's pooled connection was killed while idle: the release still goes through
        await bounded(holder.release(), "the holder's release", 2.0)

        acquired_at = await bounded(waiting, "the waiter", self.HOLD_TTL + 2.0)
        delay = acquired_at - released_at
        assert delay <= self.PROMPT, f"served {delay:.3f} s after the release"
        assert (waiter.token or 0) > (holder.token or 0)
        report(
            f"client-kill[{release}]",
            killed_pubsub=int(pubsub),
            killed_normal=int(normal),
            resubscribed_after=resubscribed,
            waiter_delay_after_release=delay,
            since_kill=time.monotonic() - killed_at,
        )


class TestClientPause:
    """``CLIENT PAUSE <ms> ALL`` longer than op_timeout: calls give up in time, never hang."""

    PAUSE = 2.0

    async def test_pause_longer_than_op_timeout(
        self, admin: Redis, open_state: Callable[..., RedisState]
    ) -> None:
        state = open_state()
        renewing = AsyncLock(state, "renewed", ttl=3.0, auto_renew=True)
        held = asyncio.Event()
        finished = asyncio.Event()

        async def hold_through_the_pause() -> None:
            async with renewing:
                held.set()
                await finished.wait()

        holding = asyncio.create_task(hold_through_the_pause())
        await bounded(held.wait(), "the renewed lock", 2.0)

        await admin.client_pause(int(self.PAUSE * 1000), all=True)
        paused_at = time.monotonic()
        operations: dict[str, Callable[[], Awaitable[object]]] = {
            "inspect": lambda: state.inspect("k"),
            "first_seen": lambda: Deduper(state).first_seen("paused"),
            "acquire": lambda: AsyncLock(state, "k1", ttl=1.0).acquire(blocking=False),
            "acquire-timeout": lambda: AsyncLock(state, "k2", ttl=1.0).acquire(timeout=5.0),
            "extend": renewing.extend,
        }
        elapsed = await asyncio.gather(
            *(assert_unavailable_within(op, name) for name, op in operations.items())
        )
        assert time.monotonic() - paused_at < self.PAUSE, "the pause ended before the checks"
        for seconds in elapsed:
            assert seconds >= OP_TIMEOUT * 0.9, "gave up before op_timeout"

        # the pause ends (the admin's own PING waits for it), then everything works again
        await bounded(admin.ping(), "the end of the pause", self.PAUSE + 2.0)
        resumed_after = time.monotonic() - paused_at
        dedupe = Deduper(state)
        assert await bounded(dedupe.first_seen("after"), "first_seen after", 2.0) is True
        lock = AsyncLock(state, "k", ttl=1.0)
        assert await bounded(lock.acquire(blocking=False), "acquire after", 2.0)
        await bounded(lock.release(), "release after", 2.0)
        # the renewed lock was never lost: its renewals retried past the pause
        assert not renewing.lost
        assert await state.inspect("renewed") is not None
        finished.set()
        await bounded(holding, "the renewed holder", 2.0)
        report(
            "client-pause",
            pause=self.PAUSE,
            surfaced_min=min(elapsed),
            surfaced_max=max(elapsed),
            resumed_after=resumed_after,
        )


class TestBlackhole:
    """A proxy between the holder and Redis adds latency, then drops everything (blackhole)."""

    TTL = 1.0
    LATENCY = 0.02  # each way

    async def test_holder_loses_lock_and_another_client_takes_over(
        self, redis_server: RedisServer, admin: Redis, open_state: Callable[..., RedisState]
    ) -> None:
        key = "k"
        async with FaultProxy(redis_server.port) as proxy:
            proxy.latency = self.LATENCY
            # its operations may take longer than the TTL: the renewer must not wait for them
            through_proxy = open_state(proxy.url, op_timeout=2.0, connect_timeout=2.0)
            direct = open_state()
            holding = asyncio.Event()
            seen: dict[str, Any] = {}

            async def holder() -> None:
                try:
                    async with AsyncLock(through_proxy, key, ttl=self.TTL, auto_renew=True) as lk:
                        seen["token"] = lk.token
                        holding.set()
                        try:
                            await asyncio.Event().wait()
                        except asyncio.CancelledError:
                            seen["cancelled_at"] = time.monotonic()
                            raise
                except LockLostError as exc:
                    seen["lost"] = exc
                seen["exited_at"] = time.monotonic()

            task = asyncio.create_task(holder())
            await bounded(holding.wait(), "the holder", 2.0)
            lock_key = through_proxy.lock_key(key)
            # wait for one renewal through the (slow) proxy: the lock's PTTL goes back up
            lowest = [self.TTL * 1000]

            async def renewed() -> bool:
                pttl = int(await admin.pttl(lock_key))
                lowest[0] = min(lowest[0], pttl)
                return pttl > lowest[0] + 100

            await until(renewed, "a renewal through the proxy", within=self.TTL)

            proxy.blackhole = True
            blackholed_at = time.monotonic()
            contender = AsyncLock(direct, key, ttl=5.0, timeout=self.TTL + 3.0)
            assert await bounded(contender.acquire(), "the takeover", self.TTL + 4.0)
            took_over_at = time.monotonic()
            await bounded(task, "the holder's exit", self.TTL + 2.0 + 2 * MARGIN + 2.0)

            assert isinstance(seen.get("lost"), LockLostError), seen
            cancelled_after = seen["cancelled_at"] - blackholed_at
            takeover_after = took_over_at - blackholed_at
            # the body was cancelled once its TTL ran out, not op_timeout later...
            assert cancelled_after <= self.TTL + MARGIN
            # ...and never ran while the other client held the lock
            assert seen["cancelled_at"] <= took_over_at + 0.01
            assert takeover_after <= self.TTL + MARGIN
            assert (contender.token or 0) > seen["token"]
            await contender.release()
            report(
                "blackhole",
                ttl=self.TTL,
                body_cancelled_after=cancelled_after,
                takeover_after=takeover_after,
                holder_exited_after=seen["exited_at"] - blackholed_at,
                dropped_bytes=proxy.dropped,
            )


class FencedStore:
    """A store on the server that accepts a write only with the highest token it has seen."""

    WRITE = """
    local highest = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
    local token = tonumber(ARGV[1])
    if token < highest then return 0 end
    redis.call('HSET', KEYS[1], 'token', token, 'value', ARGV[2])
    return 1
    """

    def __init__(self, admin: Redis, key: str) -> None:
        self.admin = admin
        self.key = key

    async def write(self, token: int | None, value: str) -> bool:
        assert token is not None
        reply: Any = await answer(self.admin.eval(self.WRITE, 1, self.key, str(token), value))
        return bool(reply)

    async def value(self) -> str:
        raw: Any = await answer(self.admin.hget(self.key, "value"))
        return raw.decode() if raw is not None else ""


class TestFencing:
    """A holder paused past its TTL writes late with its old token: the store rejects it."""

    TTL = 0.5

    async def test_stale_holders_write_is_rejected(
        self, admin: Redis, open_state: Callable[..., RedisState]
    ) -> None:
        a, b = open_state(), open_state()
        store = FencedStore(admin, "store:invoice:7")
        stale = AsyncLock(a, "invoice:7", ttl=self.TTL)  # no auto_renew
        assert await stale.acquire()
        assert await store.write(stale.token, "A: first")

        # A "pauses" (GC, a stalled event loop): it does nothing until B is done writing
        fresh = AsyncLock(b, "invoice:7", ttl=5.0, timeout=self.TTL + 3.0)
        started = time.monotonic()
        assert await bounded(fresh.acquire(), "B's acquire", self.TTL + 4.0)
        takeover = time.monotonic() - started
        assert takeover <= self.TTL + MARGIN
        assert (fresh.token or 0) > (stale.token or 0)
        assert await store.write(fresh.token, "B")

        # A wakes up and writes with its old token: rejected; its release learns the loss
        assert not await store.write(stale.token, "A: late")
        with pytest.raises(LockNotOwnedError):
            await stale.release()
        assert await store.value() == "B"
        await fresh.release()
        report(
            "fencing",
            ttl=self.TTL,
            takeover_after=takeover,
            stale_token=stale.token or 0,
            fresh_token=fresh.token or 0,
        )
