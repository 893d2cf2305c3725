"""``Semaphore`` on every backend: one small test per property of SPEC section 11 (issue #29).

Arrival order is made by explicit signals (the state's own count of places kept), never by
sleeping; timing assertions are upper bounds with wide margins.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import re
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import (
    AsyncLock,
    LockAcquisitionError,
    LockLostError,
    LockNotOwnedError,
    MemoryState,
    Semaphore,
    retry_on_lock_conflict,
)
from asynclock.state import SemaphoreState
from tests._helpers import LocksOnly, LoopTicker, eventually, finish, loop_steps

if TYPE_CHECKING:
    from asynclock import State


def permits(state: State) -> SemaphoreState:
    assert isinstance(state, SemaphoreState)
    return state


def is_owned(permit: Semaphore) -> bool:
    """``permit.owned``, read fresh (mypy would carry over an earlier check)."""
    return permit.owned


async def holders(state: State, key: str) -> int:
    return len((await permits(state).semaphore_inspect(key)).holders)


async def waiting(state: State, key: str) -> int:
    return (await permits(state).semaphore_inspect(key)).waiting


async def assert_idle_now(state: State, key: str) -> None:
    """No permit held and no place kept *now* (not after a TTL)."""
    info = await permits(state).semaphore_inspect(key)
    assert info.holders == (), info
    assert info.waiting == 0, info


async def until_waiting(state: State, key: str, count: int) -> None:
    """Wait until the state keeps ``count`` places for ``key`` (an explicit signal)."""

    async def reached() -> bool:
        return await waiting(state, key) >= count

    await eventually(reached, within=10.0, interval=0.005)


class TestPermits:
    async def test_async_with_holds_a_permit_and_releases_it(self, state: State, key: str) -> None:
        async with Semaphore(state, key, limit=2, ttl=10.0) as permit:
            assert permit.owned
            assert isinstance(permit.token, int)
            assert permit.owner.count(":") >= 3
            assert await holders(state, key) == 1
        assert not is_owned(permit)
        await assert_idle_now(state, key)

    async def test_limit_holders_at_once_and_not_one_more(
        self, state: State, peer_state: State, key: str
    ) -> None:
        held = [Semaphore(state, key, limit=3, ttl=10.0) for _ in range(3)]
        for permit in held:
            assert await permit.acquire(blocking=False)
        assert not await Semaphore(peer_state, key, limit=3).acquire(blocking=False)
        assert await Semaphore(state, key, limit=3).locked()
        await held[0].release()
        fourth = Semaphore(peer_state, key, limit=3, ttl=10.0)
        assert await fourth.acquire(blocking=False)
        for permit in [*held[1:], fourth]:
            await permit.release()
        assert not await Semaphore(state, key, limit=3).locked()
        await assert_idle_now(state, key)

    async def test_never_more_than_limit_inside(
        self, state: State, peer_state: State, key: str
    ) -> None:
        inside = most = 0

        async def worker(n: int) -> None:
            nonlocal inside, most
            client = peer_state if n % 2 else state
            for _ in range(3):
                async with Semaphore(client, key, limit=3, ttl=10.0, timeout=60.0):
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0.002)
                    inside -= 1

        await asyncio.gather(*(worker(n) for n in range(10)))
        assert 1 <= most <= 3  # (how many overlap depends on the backend's speed)
        await assert_idle_now(state, key)

    async def test_limit_one_behaves_like_a_lock(self, state: State, key: str) -> None:
        inside = most = 0
        tokens: list[int] = []

        async def worker() -> None:
            nonlocal inside, most
            async with Semaphore(state, key, limit=1, ttl=10.0, timeout=60.0) as permit:
                inside += 1
                most = max(most, inside)
                assert permit.token is not None
                tokens.append(permit.token)
                await asyncio.sleep(0)
                inside -= 1

        await asyncio.gather(*(worker() for _ in range(8)))
        assert most == 1
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == len(tokens)

    async def test_a_semaphore_key_is_not_a_lock_key(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=10.0), Semaphore(state, key, limit=1, ttl=10.0):
            assert await AsyncLock(state, key).locked()

    async def test_nonblocking_async_with_raises_with_retry_after(
        self, state: State, key: str
    ) -> None:
        async with Semaphore(state, key, limit=1, ttl=20.0):
            with pytest.raises(LockAcquisitionError) as caught:
                async with Semaphore(state, key, limit=1, ttl=5.0, blocking=False):
                    pass
        error = caught.value
        assert error.key == key
        assert error.ttl == 5.0
        assert error.retry_after is not None
        assert 15.0 < error.retry_after <= 20.0
        assert "semaphore" in str(error)


class TestTokens:
    async def test_tokens_strictly_increase(
        self, state: State, peer_state: State, key: str
    ) -> None:
        seen: list[int] = []
        for n in range(6):
            async with Semaphore(peer_state if n % 2 else state, key, limit=2) as permit:
                assert permit.token is not None
                seen.append(permit.token)
        assert all(a < b for a, b in itertools.pairwise(seen)), seen

    async def test_concurrent_permits_have_distinct_increasing_tokens(
        self, state: State, key: str
    ) -> None:
        first = Semaphore(state, key, limit=3)
        second = Semaphore(state, key, limit=3)
        assert await first.acquire()
        assert await second.acquire()
        assert first.token is not None
        assert second.token is not None
        assert first.token < second.token
        await second.release()
        third = Semaphore(state, key, limit=3)
        assert await third.acquire()
        assert third.token is not None
        assert third.token > second.token
        await first.release()
        await third.release()

    async def test_token_survives_release_as_the_last_one(self, state: State, key: str) -> None:
        permit = Semaphore(state, key, limit=1)
        assert permit.token is None
        async with permit:
            token = permit.token
        assert permit.token == token
        assert not permit.owned


class TestExpiry:
    async def test_a_permit_expires_after_its_ttl(self, state: State, key: str) -> None:
        permit = Semaphore(state, key, limit=1, ttl=0.2)
        await permit.acquire()
        await eventually(lambda: _free(state, key), within=3.0)
        with pytest.raises(LockNotOwnedError):
            await permit.release()
        assert permit.lost
        assert not permit.owned

    async def test_extend_after_expiry_does_not_recreate(self, state: State, key: str) -> None:
        permit = Semaphore(state, key, limit=1, ttl=0.2)
        await permit.acquire()
        await eventually(lambda: _free(state, key), within=3.0)
        with pytest.raises(LockNotOwnedError):
            await permit.extend()
        assert await holders(state, key) == 0
        permit._forget()

    async def test_extend_keeps_the_permit(self, state: State, key: str) -> None:
        async with Semaphore(state, key, limit=1, ttl=0.4) as permit:
            for _ in range(3):
                await asyncio.sleep(0.2)
                await permit.extend()
            info = await permits(state).semaphore_inspect(key)
            assert [h.owner for h in info.holders] == [permit.owner]
            assert info.holders[0].token == permit.token

    async def test_a_waiter_takes_over_an_expired_permit(
        self, state: State, peer_state: State, key: str
    ) -> None:
        stale = Semaphore(state, key, limit=1, ttl=0.5)
        await stale.acquire()
        started = time.monotonic()
        async with Semaphore(peer_state, key, limit=1, ttl=10.0, timeout=10.0) as taker:
            waited = time.monotonic() - started
            assert stale.token is not None
            assert taker.token is not None
            assert taker.token > stale.token
        assert 0.3 < waited < 0.5 + 2.0
        with pytest.raises(LockNotOwnedError):
            await stale.release()

    async def test_async_with_whose_permit_expired_raises_lock_lost(
        self, state: State, key: str
    ) -> None:
        with pytest.raises(LockLostError):
            async with Semaphore(state, key, limit=1, ttl=0.1):
                await asyncio.sleep(0.4)


async def _free(state: State, key: str) -> bool:
    return await holders(state, key) == 0


class TestFairness:
    @pytest.mark.parametrize("limit", [1, 2])
    async def test_waiters_are_served_oldest_first_across_clients(
        self, state: State, peer_state: State, key: str, limit: int
    ) -> None:
        held = [Semaphore(state, key, limit=limit, ttl=30.0) for _ in range(limit)]
        for permit in held:
            await permit.acquire()
        served: list[int] = []

        async def wait_turn(n: int) -> None:
            client = peer_state if n % 2 else state
            async with Semaphore(client, key, limit=limit, ttl=30.0, timeout=30.0):
                served.append(n)
                await asyncio.sleep(0.01)

        tasks = []
        for n in range(6):
            tasks.append(asyncio.create_task(wait_turn(n)))
            await until_waiting(state, key, n + 1)  # n has its place before n + 1 comes
        for permit in held:
            await permit.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 30.0)
        # Strict arrival order of eligibility: with `limit` permits, the waiters made eligible
        # together may enter in either order, never one that came `limit` places later.
        assert sorted(served) == list(range(6))
        assert all(abs(rank - n) < limit for rank, n in enumerate(served)), served
        await assert_idle_now(state, key)

    async def test_a_try_never_overtakes_a_waiter(self, state: State, key: str) -> None:
        holder = Semaphore(state, key, limit=1, ttl=30.0)
        await holder.acquire()
        waiter = asyncio.create_task(Semaphore(state, key, limit=1, ttl=30.0).acquire())
        await until_waiting(state, key, 1)
        await holder.release()
        # the permit is the waiter's: a try in between is refused, however fast it comes
        late = Semaphore(state, key, limit=1)
        got = await late.acquire(blocking=False)
        assert await asyncio.wait_for(waiter, 10.0)
        assert not got
        assert late.retry_after is not None

    async def test_a_waiter_in_another_client_wakes_at_release_not_ttl(
        self, state: State, peer_state: State, key: str
    ) -> None:
        holder = Semaphore(state, key, limit=1, ttl=30.0)
        await holder.acquire()
        entered = 0.0

        async def wait_turn() -> None:
            nonlocal entered
            async with Semaphore(peer_state, key, limit=1, ttl=30.0, timeout=20.0):
                entered = time.monotonic()

        task = asyncio.create_task(wait_turn())
        await until_waiting(state, key, 1)
        released = time.monotonic()
        await holder.release()
        await asyncio.wait_for(task, 20.0)
        assert entered - released < 1.0  # pushed (MySQL: its ear), not the 30 s TTL

    async def test_a_timed_out_waiter_leaves_its_place(self, state: State, key: str) -> None:
        holder = Semaphore(state, key, limit=1, ttl=30.0)
        await holder.acquire()
        with pytest.raises(LockAcquisitionError) as caught:
            await Semaphore(state, key, limit=1, ttl=30.0).acquire(timeout=0.2)
        assert caught.value.retry_after is not None
        assert caught.value.retry_after > 25.0
        assert await waiting(state, key) == 0
        await holder.release()
        await assert_idle_now(state, key)

    async def test_timeout_zero_tries_once(self, state: State, key: str) -> None:
        async with Semaphore(state, key, limit=1, ttl=30.0):
            started = time.monotonic()
            with pytest.raises(LockAcquisitionError):
                await Semaphore(state, key, limit=1, timeout=0).acquire()
            assert time.monotonic() - started < 2.0
            assert await waiting(state, key) == 0


class TestCancellation:
    async def test_cancel_while_waiting_leaves_no_place(
        self, state: State, peer_state: State, key: str
    ) -> None:
        holder = Semaphore(state, key, limit=1, ttl=30.0)
        await holder.acquire()
        task = asyncio.create_task(Semaphore(peer_state, key, limit=1, ttl=30.0).acquire())
        await until_waiting(state, key, 1)
        task.cancel()
        assert isinstance(await finish(task), asyncio.CancelledError)
        assert await waiting(state, key) == 0
        await holder.release()
        await assert_idle_now(state, key)

    async def test_cancel_at_every_point_of_acquire_body_and_release(
        self, state: State, key: str
    ) -> None:
        completed_early = 0
        steps = 0
        while completed_early < 3 and steps < 100_000:
            permit = Semaphore(state, key, limit=2, ttl=30.0)

            async def use(permit: Semaphore = permit) -> None:
                async with permit:
                    await asyncio.sleep(0)

            task = asyncio.create_task(use())
            await loop_steps(steps)
            task.cancel()
            outcome = await finish(task)
            assert outcome is None or isinstance(outcome, asyncio.CancelledError), outcome
            await assert_idle_now(state, key)
            if outcome is None:
                completed_early += 1
            steps = steps + 1 if steps < 200 else int(steps * 1.1)
        assert completed_early >= 3

    @pytest.mark.parametrize("seed", [1, 2])
    async def test_cancellation_storm_leaks_no_permit(
        self, state: State, peer_state: State, key: str, seed: int
    ) -> None:
        rng = random.Random(seed)
        inside = most = finished = 0

        async def worker(n: int) -> None:
            nonlocal inside, most, finished
            client = peer_state if n % 3 == 0 else state
            async with Semaphore(client, key, limit=3, ttl=30.0, timeout=60.0):
                inside += 1
                most = max(most, inside)
                try:
                    await asyncio.sleep(rng.uniform(0, 0.01))
                finally:
                    inside -= 1
            finished += 1

        tasks = [asyncio.create_task(worker(n)) for n in range(30)]
        doomed = rng.sample(tasks, 15)
        for task in doomed:
            await asyncio.sleep(rng.uniform(0, 0.01))
            task.cancel()
        await asyncio.wait_for(asyncio.wait(tasks), 60)
        for task in tasks:
            outcome = await finish(task)
            if task in doomed:
                assert outcome is None or isinstance(outcome, asyncio.CancelledError), outcome
            else:
                assert outcome is None, outcome
        assert most <= 3
        assert finished >= 15
        await assert_idle_now(state, key)
        # no count drift: all three permits can be taken at once again, and not a fourth
        taken = [Semaphore(state, key, limit=3, ttl=10.0) for _ in range(3)]
        assert all([await p.acquire(blocking=False) for p in taken])
        assert not await Semaphore(state, key, limit=3).acquire(blocking=False)
        for permit in taken:
            await permit.release()

    async def test_a_task_that_ends_holding_a_permit_gives_it_back(
        self, state: State, key: str
    ) -> None:
        async def leave_it() -> None:
            await Semaphore(state, key, limit=1, ttl=30.0).acquire()

        await asyncio.create_task(leave_it())
        await eventually(lambda: _free(state, key), within=5.0, interval=0.005)


class Sabotaged:
    """An auto-renewed permit given back behind its holder's back (a force-unlock, a failover)."""

    def __init__(self, permit: Semaphore, state: State) -> None:
        self.permit, self.state = permit, state
        self.finished_body = False

    async def run(self) -> None:
        async with self.permit:
            assert await permits(self.state).semaphore_release(self.permit.key, self.permit.owner)
            await asyncio.sleep(30)
            self.finished_body = True


class TestAutoRenew:
    async def test_auto_renew_keeps_the_permit_past_its_ttl(self, state: State, key: str) -> None:
        async with Semaphore(state, key, limit=1, ttl=1.0, auto_renew=True) as permit:
            await asyncio.sleep(3.2)  # more than three TTLs
            assert not await Semaphore(state, key, limit=1).acquire(blocking=False)
        assert not permit.lost
        await assert_idle_now(state, key)

    async def test_a_lost_permit_cancels_the_body_and_raises_lock_lost(
        self, state: State, key: str
    ) -> None:
        body = Sabotaged(Semaphore(state, key, limit=2, ttl=0.9, auto_renew=True), state)
        started = time.monotonic()
        with pytest.raises(LockLostError) as caught:
            await body.run()
        assert time.monotonic() - started < 0.9 + 2.0
        assert not body.finished_body
        assert body.permit.lost
        assert not body.permit.owned
        assert caught.value.key == key
        task = asyncio.current_task()
        if sys.version_info >= (3, 11) and task is not None:
            assert task.cancelling() == 0


class TestRetry:
    async def test_retry_on_lock_conflict_retries_a_full_semaphore(
        self, state: State, key: str
    ) -> None:
        holder = Semaphore(state, key, limit=1, ttl=30.0)
        await holder.acquire()
        runs = 0

        @retry_on_lock_conflict(wait=lambda n: 0.05, attempts=5)
        async def job() -> str:
            nonlocal runs
            runs += 1
            if runs == 2:
                await holder.release()
            async with Semaphore(state, key, limit=1, ttl=5.0, blocking=False):
                return "done"

        assert await job() == "done"
        assert runs == 2  # the holder let go during the second execution

    async def test_process_without_lock_grants_the_semaphore(self, state: State, key: str) -> None:
        holder = Semaphore(state, key, limit=1, ttl=30.0)
        await holder.acquire()

        @retry_on_lock_conflict(wait=0.01, attempts=2, on_exhaustion="process_without_lock")
        async def job() -> bool:
            async with Semaphore(state, key, limit=1, blocking=False) as permit:
                return permit.granted

        assert await job() is True
        assert await holders(state, key) == 1
        await holder.release()

    async def test_wait_lock_ttl_waits_the_truthful_retry_after(
        self, state: State, key: str
    ) -> None:
        holder = Semaphore(state, key, limit=1, ttl=0.6)
        await holder.acquire()
        started = time.monotonic()

        @retry_on_lock_conflict(wait="lock_ttl", attempts=2)
        async def job() -> None:
            async with Semaphore(state, key, limit=1, ttl=5.0, blocking=False):
                pass

        await job()
        assert 0.3 < time.monotonic() - started < 0.6 + 2.0


BAD_TTLS = [0, -1.0, math.nan, math.inf]


class TestBadInput:
    @pytest.mark.parametrize("limit", [0, -1, -10], ids=repr)
    async def test_limit_below_one_raises_value_error(
        self, state: State, key: str, limit: int
    ) -> None:
        with pytest.raises(ValueError, match=re.escape(f"got {limit!r}")):
            Semaphore(state, key, limit=limit)

    @pytest.mark.parametrize("limit", [True, 2.0, "3", None], ids=repr)
    async def test_limit_of_another_type_raises_type_error(
        self, state: State, key: str, limit: object
    ) -> None:
        make: Any = Semaphore
        with pytest.raises(TypeError, match="limit"):
            make(state, key, limit=limit)

    @pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
    async def test_bad_ttl_raises_value_error(self, state: State, key: str, ttl: float) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(ttl))):
            Semaphore(state, key, limit=2, ttl=ttl)

    async def test_empty_key_raises_value_error(self, state: State) -> None:
        with pytest.raises(ValueError, match="key"):
            Semaphore(state, "", limit=2)

    @pytest.mark.parametrize("timeout", [-0.1, -1, math.nan], ids=repr)
    async def test_bad_timeout_raises_value_error(
        self, state: State, key: str, timeout: float
    ) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(timeout))):
            Semaphore(state, key, limit=2, timeout=timeout)
        with pytest.raises(ValueError, match=re.escape(repr(timeout))):
            await Semaphore(state, key, limit=2).acquire(timeout=timeout)
        await assert_idle_now(state, key)

    async def test_a_state_without_the_capability_is_refused(self, key: str) -> None:
        with pytest.raises(TypeError, match="LocksOnly"):
            Semaphore(LocksOnly(), key, limit=2)


class TestMisuse:
    async def test_reentering_one_object_raises_runtime_error(self, state: State, key: str) -> None:
        permit = Semaphore(state, key, limit=3)
        async with permit:
            with pytest.raises(RuntimeError, match="reentrant"):
                await permit.acquire()

    async def test_release_without_acquire_raises_runtime_error(
        self, state: State, key: str
    ) -> None:
        with pytest.raises(RuntimeError, match="not held"):
            await Semaphore(state, key, limit=3).release()

    async def test_release_from_another_task_raises_runtime_error(
        self, state: State, key: str
    ) -> None:
        permit = Semaphore(state, key, limit=3)
        await permit.acquire()
        with pytest.raises(RuntimeError, match="did not acquire"):
            await asyncio.create_task(permit.release())
        await permit.release()


class TestYieldsToTheLoop:
    async def test_every_method_yields(self, state: State, key: str) -> None:
        permit = Semaphore(state, key, limit=1, ttl=10.0)
        other = Semaphore(state, key, limit=1, ttl=10.0)
        async with LoopTicker() as ticker:
            assert await ticker.assert_yields(permit.acquire(), "acquire")
            assert not await ticker.assert_yields(other.acquire(blocking=False), "a refused try")
            await ticker.assert_yields(permit.extend(), "extend")
            assert await ticker.assert_yields(permit.locked(), "locked")
            await ticker.assert_yields(permit.release(), "release")


def test_memory_state_has_the_capability() -> None:
    assert isinstance(MemoryState(), SemaphoreState)


@pytest.mark.parametrize(
    "odd",
    ["{tag}", "}{", "a b\tc", "ключ:🔑", "%_!*?[x]", "x" * 2000, "'; DROP TABLE x; --"],
    ids=["braces", "inverted-braces", "whitespace", "unicode", "wildcards", "long", "sql"],
)
async def test_odd_keys_are_keys_like_any_other(state: State, key: str, odd: str) -> None:
    name = f"{key}:{odd}"
    first = Semaphore(state, name, limit=1, ttl=10.0)
    assert await first.acquire(blocking=False)
    assert not await Semaphore(state, name, limit=1).acquire(blocking=False)
    assert await holders(state, f"{key}:other") == 0
    info = await permits(state).semaphore_inspect(name)
    assert [h.owner for h in info.holders] == [first.owner]
    await first.release()
    await assert_idle_now(state, name)
