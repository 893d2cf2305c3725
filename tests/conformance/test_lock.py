"""``AsyncLock`` on every backend: one small test per property of SPEC section 2.

Timing assertions are upper bounds with wide margins (a loaded two-core machine must not make
them flaky); where a test needs another task to be *waiting*, it waits ``SETTLE`` seconds, which
only orders arrivals and never decides a race.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import random
import re
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import (
    AsyncLock,
    LockAcquisitionError,
    LockError,
    LockLostError,
    LockNotOwnedError,
)
from tests._helpers import SETTLE, LoopTicker, eventually, finish, loop_steps, owned, token_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from asynclock import State
    from tests.conftest import Target


async def is_free(state: State, key: str) -> bool:
    """True when nobody holds ``key``: checked with a fresh lock, as a user would."""
    return not await AsyncLock(state, key).locked()


def cancel_points() -> Iterator[int]:
    """Loop-step counts to cancel after: every count up to 200, then 10% further each time.

    Dense where a fast backend's acquire, body and release happen; then geometric, so that on a
    backend whose round trips take thousands of loop steps (a MariaDB commit flush takes ~3 ms)
    the cancellation point still walks through the whole operation and past its end.
    """
    yield from range(200)
    steps = 200.0
    while steps < 1_000_000:
        steps *= 1.1
        yield int(steps)


async def assert_free_now(state: State, key: str) -> None:
    """The key is free *now* (not after a TTL): a fresh lock gets it without waiting."""
    probe = AsyncLock(state, key, ttl=5.0)
    if await probe.locked():
        holder = await state.inspect(key)
        # Say whether it is freed a little later (a release still running in the background)
        # or stays held (a leak until the TTL): both fail, the message tells them apart.
        try:
            late = await eventually(lambda: is_free(state, key), within=1.0, interval=0.001)
            how = f"freed {late * 1000:.1f} ms later"
        except AssertionError:
            how = "still held 1 s later"
        raise AssertionError(f"{key!r} is still held after the fact ({holder!r}); {how}")
    assert await probe.acquire(blocking=False)
    await probe.release()


class TestAcquireRelease:
    async def test_async_with_yields_the_lock_and_releases_on_exit(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        async with lock as held:
            assert held is lock
            assert held.owned
            assert await lock.locked()
        assert not lock.owned
        assert not await lock.locked()

    async def test_acquire_returns_true_and_sets_owner_and_token(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        assert not lock.owned
        assert await lock.acquire() is True
        assert owned(lock)
        assert isinstance(lock.token, int)
        assert isinstance(lock.owner, str)
        assert lock.owner
        info = await state.inspect(key)
        assert info is not None
        assert (info.owner, info.token) == (lock.owner, lock.token)
        await lock.release()
        assert not lock.owned
        assert await state.inspect(key) is None

    async def test_release_on_exception_in_body(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        with pytest.raises(ZeroDivisionError):
            async with lock:
                _ = 1 / 0
        assert not lock.owned
        await assert_free_now(state, key)

    async def test_lock_object_can_be_acquired_again_after_release(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        for _ in range(3):
            async with lock:
                assert lock.owned
        assert not await lock.locked()

    async def test_keys_are_independent(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=10.0):
            other = AsyncLock(state, key + "-other", ttl=10.0)
            assert await other.acquire(blocking=False)
            await other.release()

    async def test_peer_client_sees_the_holder(
        self, state: State, peer_state: State, key: str
    ) -> None:
        async with AsyncLock(state, key, ttl=10.0):
            assert await AsyncLock(peer_state, key).locked()
            assert not await AsyncLock(peer_state, key).acquire(blocking=False)
        assert not await AsyncLock(peer_state, key).locked()


class TestMutualExclusion:
    @pytest.mark.parametrize("use_peer", [False, True], ids=["one-client", "two-clients"])
    async def test_one_holder_at_a_time(
        self, state: State, peer_state: State, key: str, use_peer: bool
    ) -> None:
        tasks, rounds = 12, 3
        inside = 0
        most_inside = 0
        entries = 0

        async def worker(i: int) -> None:
            nonlocal inside, most_inside, entries
            client = peer_state if use_peer and i % 2 else state
            for _ in range(rounds):
                async with AsyncLock(client, key, ttl=10.0, timeout=60.0):
                    inside += 1
                    most_inside = max(most_inside, inside)
                    await loop_steps(3)
                    entries += 1
                    inside -= 1

        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(tasks))), 90)
        assert most_inside == 1
        assert entries == tasks * rounds
        await assert_free_now(state, key)

    async def test_nonblocking_acquire_against_holder_returns_false(
        self, state: State, key: str
    ) -> None:
        async with AsyncLock(state, key, ttl=10.0):
            other = AsyncLock(state, key, ttl=10.0)
            assert await other.acquire(blocking=False) is False
            assert not other.owned

    async def test_nonblocking_lock_in_async_with_raises_acquisition_error(
        self, state: State, key: str
    ) -> None:
        reached = False
        async with AsyncLock(state, key, ttl=10.0):
            with pytest.raises(LockAcquisitionError):
                async with AsyncLock(state, key, ttl=10.0, blocking=False):
                    reached = True
        assert not reached

    async def test_acquisition_error_carries_key_ttl_and_retry_after(
        self, state: State, key: str
    ) -> None:
        async with AsyncLock(state, key, ttl=10.0):
            with pytest.raises(LockAcquisitionError) as caught:
                async with AsyncLock(state, key, ttl=5.0, blocking=False):
                    pass
        error = caught.value
        assert isinstance(error, LockError)
        assert error.key == key
        assert error.ttl == 5.0
        assert error.retry_after is not None
        # The holder's lock has 10 s minus the little time since it was taken.
        assert 7.0 <= error.retry_after <= 10.0

    async def test_retry_after_tracks_the_holders_remaining_ttl(
        self, state: State, key: str
    ) -> None:
        async with AsyncLock(state, key, ttl=2.0):
            await asyncio.sleep(1.0)
            with pytest.raises(LockAcquisitionError) as caught:
                await AsyncLock(state, key, ttl=5.0).acquire(timeout=0)
        assert caught.value.retry_after is not None
        assert 0.0 <= caught.value.retry_after <= 1.05


class TestTimeouts:
    async def test_acquire_timeout_raises_after_the_timeout(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=30.0):
            other = AsyncLock(state, key, ttl=10.0)
            start = time.monotonic()
            with pytest.raises(LockAcquisitionError) as caught:
                await other.acquire(timeout=0.2)
            elapsed = time.monotonic() - start
            assert not other.owned
        assert 0.18 <= elapsed < 1.5
        assert caught.value.key == key
        assert caught.value.retry_after is not None
        assert caught.value.retry_after > 25.0

    async def test_constructor_timeout_applies_to_async_with(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=30.0):
            start = time.monotonic()
            with pytest.raises(LockAcquisitionError):
                async with AsyncLock(state, key, ttl=10.0, timeout=0.2):
                    pass
            elapsed = time.monotonic() - start
        assert 0.18 <= elapsed < 1.5

    async def test_timeout_zero_tries_once(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=30.0):
            start = time.monotonic()
            with pytest.raises(LockAcquisitionError):
                await AsyncLock(state, key).acquire(timeout=0)
            assert time.monotonic() - start < 1.0

    async def test_blocking_false_ignores_timeout_and_never_raises(
        self, state: State, key: str
    ) -> None:
        async with AsyncLock(state, key, ttl=30.0):
            start = time.monotonic()
            assert await AsyncLock(state, key).acquire(blocking=False, timeout=5.0) is False
            assert time.monotonic() - start < 1.0

    async def test_acquire_with_timeout_succeeds_when_free(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        assert await lock.acquire(timeout=1.0) is True
        await lock.release()


class TestExpiry:
    async def test_lock_expires_after_its_ttl(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=0.2)
        await lock.acquire()
        await eventually(lambda: is_free(state, key), within=3.0)
        # Not released by us: the server let it expire.
        assert lock.owned

    async def test_release_after_expiry_raises_not_owned(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=0.2)
        await lock.acquire()
        await eventually(lambda: is_free(state, key), within=3.0)
        with pytest.raises(LockNotOwnedError) as caught:
            await lock.release()
        assert caught.value.key == key
        assert not lock.owned

    async def test_extend_after_expiry_raises_not_owned_and_does_not_recreate(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=0.2)
        await lock.acquire()
        await eventually(lambda: is_free(state, key), within=3.0)
        with pytest.raises(LockNotOwnedError):
            await lock.extend()
        assert await is_free(state, key)

    async def test_waiter_takes_over_an_expired_lock(self, state: State, key: str) -> None:
        first = AsyncLock(state, key, ttl=0.3)
        await first.acquire()
        second = AsyncLock(state, key, ttl=10.0)
        start = time.monotonic()
        assert await second.acquire(timeout=10.0)
        # It waited for the remaining TTL (about 0.3 s), not for a long backoff.
        assert time.monotonic() - start < 2.0
        assert token_of(second) > token_of(first)

        with pytest.raises(LockNotOwnedError):
            await first.extend()
        with pytest.raises(LockNotOwnedError):
            await first.release()
        # The failed calls did not touch the new holder's lock.
        info = await state.inspect(key)
        assert info is not None
        assert info.owner == second.owner
        assert second.owned
        await second.release()
        await assert_free_now(state, key)

    async def test_async_with_whose_lock_expired_in_the_body_raises_lock_lost(
        self, state: State, key: str
    ) -> None:
        # The body finishes normally after the TTL ran out: the lock was lost while held, and
        # that is what `async with` reports (docs/exceptions.md), not "not owned".
        lock = AsyncLock(state, key, ttl=0.2)
        with pytest.raises(LockLostError) as caught:
            async with lock:
                await eventually(lambda: is_free(state, key), within=3.0)
        assert caught.value.key == key
        assert isinstance(caught.value.__cause__, LockNotOwnedError)
        assert lock.lost
        assert not lock.owned

    async def test_async_with_whose_body_raised_keeps_the_bodys_error(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=0.2)

        async def outlive_then_fail() -> None:
            async with lock:
                await eventually(lambda: is_free(state, key), within=3.0)
                raise KeyError("the body's own error")

        with pytest.raises(KeyError):
            await outlive_then_fail()
        assert not lock.owned

    async def test_takeover_by_peer_client(self, state: State, peer_state: State, key: str) -> None:
        first = AsyncLock(state, key, ttl=0.3)
        await first.acquire()
        second = AsyncLock(peer_state, key, ttl=10.0)
        assert await second.acquire(timeout=10.0)
        with pytest.raises(LockNotOwnedError):
            await first.release()
        assert (await peer_state.inspect(key)) is not None
        await second.release()


class TestExtend:
    async def test_extend_with_ttl_sets_a_new_ttl(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=1.0) as lock:
            await lock.extend(20.0)
            info = await state.inspect(key)
            assert info is not None
            assert 15.0 < info.remaining <= 20.0
            with pytest.raises(LockAcquisitionError) as caught:
                await AsyncLock(state, key).acquire(timeout=0)
            assert caught.value.retry_after is not None
            assert caught.value.retry_after > 15.0

    async def test_extend_without_ttl_resets_to_the_locks_ttl(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=2.0) as lock:
            await asyncio.sleep(1.0)
            await lock.extend()
            info = await state.inspect(key)
            assert info is not None
            # Without the reset at most 1.0 s would be left.
            assert 1.5 < info.remaining <= 2.0

    async def test_extend_keeps_the_lock_past_its_first_ttl(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=0.6) as lock:
            for _ in range(4):
                await asyncio.sleep(0.2)
                await lock.extend()
            # 0.8 s after acquiring a 0.6 s lock, it is still ours.
            info = await state.inspect(key)
            assert info is not None
            assert info.owner == lock.owner

    async def test_extend_keeps_owner_and_token(self, state: State, key: str) -> None:
        async with AsyncLock(state, key, ttl=5.0) as lock:
            owner, token = lock.owner, lock.token
            await lock.extend(10.0)
            assert (lock.owner, lock.token) == (owner, token)
            info = await state.inspect(key)
            assert info is not None
            assert (info.owner, info.token) == (owner, token)


class TestOwnersAndTokens:
    async def test_owner_has_host_pid_task_random_shape(self, state: State, key: str) -> None:
        async with AsyncLock(state, key) as lock:
            parts = lock.owner.rsplit(":", 3)
        assert len(parts) == 4, lock.owner
        host, pid, task, rand = parts
        assert host
        assert pid == str(os.getpid())
        assert task
        assert rand

    async def test_owner_is_fresh_per_acquisition(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=5.0)
        owners = []
        for _ in range(5):
            async with lock:
                owners.append(lock.owner)
        assert len(set(owners)) == len(owners)

    async def test_owners_differ_between_tasks(self, state: State, key: str) -> None:
        owners: list[str] = []

        async def take(i: int) -> None:
            async with AsyncLock(state, f"{key}-{i}", ttl=5.0) as lock:
                owners.append(lock.owner)

        await asyncio.gather(*(take(i) for i in range(8)))
        assert len(set(owners)) == len(owners)

    async def test_tokens_increase_across_sequential_acquisitions(
        self, state: State, peer_state: State, key: str
    ) -> None:
        tokens = []
        same = AsyncLock(state, key, ttl=5.0)
        for i in range(8):
            lock = same if i % 2 else AsyncLock(peer_state if i % 3 else state, key, ttl=5.0)
            async with lock:
                tokens.append(token_of(lock))
        assert tokens == sorted(set(tokens)), tokens

    async def test_tokens_increase_across_handoffs_to_waiters(
        self, state: State, peer_state: State, key: str
    ) -> None:
        granted: list[int] = []

        async def worker(i: int) -> None:
            lock = AsyncLock(peer_state if i % 3 == 0 else state, key, ttl=10.0, timeout=60.0)
            for _ in range(3):
                async with lock:
                    granted.append(token_of(lock))
                    await loop_steps(2)

        await asyncio.wait_for(asyncio.gather(*(worker(i) for i in range(6))), 60)
        assert len(granted) == 18
        assert all(a < b for a, b in itertools.pairwise(granted)), granted

    async def test_tokens_are_per_key_and_never_reused_after_expiry(
        self, state: State, key: str
    ) -> None:
        first = AsyncLock(state, key, ttl=0.2)
        await first.acquire()
        await eventually(lambda: is_free(state, key), within=3.0)
        second = AsyncLock(state, key, ttl=5.0)
        assert await second.acquire(blocking=False)
        assert token_of(second) > token_of(first)
        await second.release()


class TestFairnessAndWakeups:
    async def test_waiters_are_served_in_arrival_order(self, state: State, key: str) -> None:
        holder = AsyncLock(state, key, ttl=30.0)
        await holder.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with AsyncLock(state, key, ttl=30.0, timeout=60.0):
                order.append(i)
                await loop_steps(2)

        tasks = []
        for i in range(6):
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(SETTLE)  # waiter i is queued before waiter i + 1 arrives
        assert order == []
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert order == list(range(6))

    async def test_a_cancelled_waiter_leaves_the_line_without_breaking_the_order(
        self, state: State, key: str
    ) -> None:
        holder = AsyncLock(state, key, ttl=30.0)
        await holder.acquire()
        order: list[int] = []

        async def waiter(i: int) -> None:
            async with AsyncLock(state, key, ttl=30.0, timeout=60.0):
                order.append(i)

        tasks = []
        for i in range(5):
            tasks.append(asyncio.create_task(waiter(i)))
            await asyncio.sleep(SETTLE)
        tasks[2].cancel()
        assert isinstance(await finish(tasks[2]), asyncio.CancelledError)
        await holder.release()
        await asyncio.wait_for(asyncio.gather(*tasks[:2], *tasks[3:]), 30)
        assert order == [0, 1, 3, 4]
        await assert_free_now(state, key)

    async def test_a_timed_out_waiter_does_not_hold_up_the_next(
        self, state: State, key: str
    ) -> None:
        holder = AsyncLock(state, key, ttl=30.0)
        await holder.acquire()
        impatient = AsyncLock(state, key, ttl=30.0)
        patient_got_at: list[float] = []

        async def patient() -> None:
            async with AsyncLock(state, key, ttl=30.0, timeout=20.0):
                patient_got_at.append(time.monotonic())

        first = asyncio.create_task(impatient.acquire(timeout=0.2))
        await asyncio.sleep(SETTLE / 2)
        second = asyncio.create_task(patient())
        assert isinstance(await finish(first), LockAcquisitionError)
        released_at = time.monotonic()
        await holder.release()
        await asyncio.wait_for(second, 20)
        assert patient_got_at[0] - released_at < 1.0
        assert not impatient.owned
        await assert_free_now(state, key)

    async def test_waiter_in_same_client_wakes_at_release_not_ttl(
        self, state: State, key: str
    ) -> None:
        await self._assert_wakes_promptly(state, state, key)

    async def test_waiter_in_peer_client_wakes_at_release_not_ttl(
        self, state: State, peer_state: State, key: str
    ) -> None:
        # Another client cannot be handed the lock in-process: this is the notification path
        # (Redis pub/sub, LISTEN/NOTIFY, ...).
        await self._assert_wakes_promptly(state, peer_state, key)

    @staticmethod
    async def _assert_wakes_promptly(holder_state: State, waiter_state: State, key: str) -> None:
        latencies = []

        got_at: list[float] = []

        async def waiter() -> None:
            async with AsyncLock(waiter_state, key, ttl=30.0, timeout=20.0):
                got_at.append(time.monotonic())

        for _ in range(5):
            holder = AsyncLock(holder_state, key, ttl=30.0)
            await holder.acquire()
            task = asyncio.create_task(waiter())
            await asyncio.sleep(SETTLE)
            assert not task.done()
            released_at = time.monotonic()
            await holder.release()
            await asyncio.wait_for(task, 25)
            latencies.append(got_at.pop() - released_at)
        # The holder's TTL was 30 s: only a release notification explains a fast wake-up; the
        # median bound also catches a poller that sleeps 100 ms or more between tries.
        assert max(latencies) < 1.0, latencies
        assert statistics.median(latencies) < 0.1, latencies


class TestCancellation:
    async def test_cancel_while_waiting_leaves_no_holder(
        self, state: State, peer_state: State, key: str
    ) -> None:
        holder = AsyncLock(state, key, ttl=30.0)
        await holder.acquire()
        waiter_lock = AsyncLock(state, key, ttl=30.0)
        task = asyncio.create_task(waiter_lock.acquire())
        await asyncio.sleep(SETTLE)
        task.cancel()
        assert isinstance(await finish(task), asyncio.CancelledError)
        assert not waiter_lock.owned
        await holder.release()
        # The cancelled waiter was not handed the lock.
        await assert_free_now(peer_state, key)

    async def test_cancel_in_body_releases(self, state: State, key: str) -> None:
        in_body = asyncio.Event()

        async def hold() -> None:
            async with AsyncLock(state, key, ttl=30.0):
                in_body.set()
                await asyncio.sleep(60)

        task = asyncio.create_task(hold())
        await in_body.wait()
        task.cancel()
        assert isinstance(await finish(task), asyncio.CancelledError)
        await assert_free_now(state, key)

    async def test_cancel_at_every_point_of_acquire_body_and_release(
        self, state: State, key: str
    ) -> None:
        # Cancel after 0, 1, 2, ... loop steps until the task completes before the cancel: this
        # walks the cancellation point through acquire, the body and release.
        completed_early = 0
        for steps in cancel_points():
            lock = AsyncLock(state, key, ttl=30.0)

            async def use(lock: AsyncLock = lock) -> None:
                async with lock:
                    await asyncio.sleep(0)

            task = asyncio.create_task(use())
            await loop_steps(steps)
            task.cancel()
            outcome = await finish(task)
            assert outcome is None or isinstance(outcome, asyncio.CancelledError), outcome
            await assert_free_now(state, key)
            if outcome is None:
                completed_early += 1
                if completed_early >= 3:
                    break
        assert completed_early >= 3, "the task never completed before its cancellation"

    async def test_cancel_at_every_point_of_release(self, state: State, key: str) -> None:
        completed_early = 0
        for steps in cancel_points():
            lock = AsyncLock(state, key, ttl=30.0)
            acquired = asyncio.Event()
            go = asyncio.Event()

            async def use(
                lock: AsyncLock = lock, acquired: asyncio.Event = acquired, go: asyncio.Event = go
            ) -> None:
                await lock.acquire()
                try:
                    acquired.set()
                    await go.wait()
                finally:
                    await lock.release()

            task = asyncio.create_task(use())
            await acquired.wait()
            go.set()
            await loop_steps(steps)
            task.cancel()
            outcome = await finish(task)
            assert outcome is None or isinstance(outcome, asyncio.CancelledError), outcome
            await assert_free_now(state, key)
            if outcome is None:
                completed_early += 1
                if completed_early >= 3:
                    break
        assert completed_early >= 3

    @pytest.mark.parametrize("use_peer", [False, True], ids=["one-client", "two-clients"])
    async def test_cancelling_every_waiter_around_a_release_leaves_key_free(
        self, state: State, peer_state: State, key: str, use_peer: bool
    ) -> None:
        # A holder releases while three waiters queue; all waiters are cancelled a few loop
        # steps later, at whatever point the handover has reached.
        waiter_state = peer_state if use_peer else state
        for steps in range(60):
            holder = AsyncLock(state, key, ttl=30.0)
            await holder.acquire()

            async def work() -> None:
                async with AsyncLock(waiter_state, key, ttl=30.0, timeout=60.0):
                    await asyncio.sleep(0)

            waiters = [asyncio.create_task(work()) for _ in range(3)]
            await loop_steps(steps)
            await holder.release()
            await loop_steps(steps)
            for task in waiters:
                task.cancel()
            await asyncio.wait(waiters)
            try:
                await assert_free_now(state, key)
            except AssertionError as exc:
                raise AssertionError(f"after {steps} loop steps: {exc}") from None

    @pytest.mark.parametrize("seed", [1, 2, 3])
    async def test_cancellation_storm_leaves_key_free(
        self, state: State, peer_state: State, key: str, seed: int
    ) -> None:
        rng = random.Random(seed)
        inside = 0
        most_inside = 0
        finished = 0

        async def worker(i: int) -> None:
            nonlocal inside, most_inside, finished
            client = peer_state if i % 4 == 0 else state
            async with AsyncLock(client, key, ttl=30.0, timeout=60.0):
                inside += 1
                most_inside = max(most_inside, inside)
                try:
                    await asyncio.sleep(rng.uniform(0, 0.01))
                finally:
                    inside -= 1
            finished += 1

        tasks = [asyncio.create_task(worker(i)) for i in range(30)]
        doomed = rng.sample(tasks, 15)
        for task in doomed:
            await asyncio.sleep(rng.uniform(0, 0.01))
            task.cancel()
        await asyncio.wait_for(asyncio.wait(tasks), 60)
        outcomes = [await finish(task) for task in tasks]
        for task, outcome in zip(tasks, outcomes, strict=True):
            if task in doomed:
                assert outcome is None or isinstance(outcome, asyncio.CancelledError), outcome
            else:
                assert outcome is None, outcome
        assert most_inside == 1
        assert finished >= 15
        await assert_free_now(state, key)
        await assert_free_now(peer_state, key)


class Sabotaged:
    """The body of an auto-renewed lock whose key is released behind its back (as a force-unlock
    or a server failover would), optionally taken by ``thief`` right after."""

    def __init__(self, lock: AsyncLock, state: State, thief: AsyncLock | None = None) -> None:
        self.lock = lock
        self.state = state
        self.thief = thief
        self.owner = ""
        self.lost_at = 0.0
        self.finished_body = False

    async def run(self) -> None:
        async with self.lock:
            self.owner = self.lock.owner
            released = await self.state.release(self.lock.key, self.lock.owner)
            assert released.owned
            if self.thief is not None:
                assert await self.thief.acquire(blocking=False)
            self.lost_at = time.monotonic()
            await asyncio.sleep(30)
            self.finished_body = True


class TestShutdown:
    """The usual shutdown (cancel the workers, await them, close the state) leaves no lock."""

    async def test_cancel_then_aclose_leaves_no_lock_behind(
        self, server_target: Target, server_state: State, key: str
    ) -> None:
        for steps in range(0, 40, 3):
            state = server_target.open()
            holder = AsyncLock(server_state, key, ttl=30.0)
            await holder.acquire()

            async def work(state: State = state) -> None:
                async with AsyncLock(state, key, ttl=30.0, timeout=60.0):
                    await asyncio.sleep(0)

            workers = [asyncio.create_task(work()) for _ in range(3)]
            await loop_steps(steps)
            await holder.release()
            await loop_steps(steps)
            for task in workers:
                task.cancel()
            await asyncio.wait(workers)
            await state.aclose()
            await assert_free_now(server_state, key)


class TestAutoRenew:
    async def test_auto_renew_keeps_the_lock_past_its_ttl(
        self, state: State, peer_state: State, key: str
    ) -> None:
        # a 1 s TTL, renewed every 0.33 s: a renewal has 0.67 s to land, which a server shared
        # with the suite's other workers gives it (0.5 s, renewals with 0.33 s, once did not)
        lock = AsyncLock(state, key, ttl=1.0, auto_renew=True)
        async with lock:
            await asyncio.sleep(3.2)  # more than three TTLs
            info = await peer_state.inspect(key)
            assert info is not None
            assert info.owner == lock.owner
            assert not await AsyncLock(peer_state, key).acquire(blocking=False)
        assert not lock.lost
        assert not lock.owned
        await assert_free_now(state, key)

    async def test_lost_lock_cancels_body_and_raises_lock_lost(
        self, state: State, key: str
    ) -> None:
        body = Sabotaged(AsyncLock(state, key, ttl=0.9, auto_renew=True), state)
        with pytest.raises(LockLostError) as caught:
            await body.run()
        elapsed = time.monotonic() - body.lost_at
        assert not body.finished_body
        assert elapsed < 0.9 + 2.0  # the next renewal (every 0.3 s) finds it gone
        assert body.lock.lost
        assert not body.lock.owned
        assert caught.value.key == key
        assert caught.value.owner == body.owner
        await assert_free_now(state, key)

    async def test_lost_lock_does_not_release_the_new_holder(
        self, state: State, peer_state: State, key: str
    ) -> None:
        thief = AsyncLock(peer_state, key, ttl=30.0)
        body = Sabotaged(AsyncLock(state, key, ttl=0.9, auto_renew=True), state, thief)
        with pytest.raises(LockLostError):
            await body.run()
        assert body.lock.lost
        info = await peer_state.inspect(key)
        assert info is not None
        assert info.owner == thief.owner
        await thief.release()

    async def test_the_task_is_usable_after_lock_lost(self, state: State, key: str) -> None:
        # LockLostError replaces the cancellation: the task itself is not left cancelled.
        body = Sabotaged(AsyncLock(state, key, ttl=0.6, auto_renew=True), state)
        with pytest.raises(LockLostError):
            await body.run()
        task = asyncio.current_task()
        assert task is not None
        if sys.version_info >= (3, 11):
            assert task.cancelling() == 0
        await asyncio.sleep(0.01)
        async with AsyncLock(state, key, ttl=1.0):
            pass

    async def test_max_lifetime_caps_the_renewals(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=0.3, auto_renew=True, max_lifetime=0.6)

        async def body() -> None:
            async with lock:
                await asyncio.sleep(30)

        start = time.monotonic()
        with pytest.raises(LockLostError):
            await body()
        assert time.monotonic() - start < 0.6 + 0.3 + 2.0
        assert lock.lost

    async def test_a_lost_lock_is_reset_by_the_next_acquisition(
        self, state: State, key: str
    ) -> None:
        body = Sabotaged(AsyncLock(state, key, ttl=0.6, auto_renew=True), state)
        with pytest.raises(LockLostError):
            await body.run()
        assert body.lock.lost
        seen = []
        async with body.lock:
            seen.append((body.lock.lost, body.lock.owned))
        assert seen == [(False, True)]


class TestMisuse:
    async def test_reentering_one_lock_object_raises_runtime_error(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        async with lock:
            with pytest.raises(RuntimeError):
                async with lock:
                    pass
            with pytest.raises(RuntimeError):
                await lock.acquire(blocking=False)
            assert lock.owned
            assert await lock.locked()
        await assert_free_now(state, key)

    async def test_release_from_another_task_raises_runtime_error(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        await lock.acquire()
        intruder = asyncio.create_task(lock.release())
        error = await finish(intruder)
        assert isinstance(error, RuntimeError), error
        assert lock.owned
        assert await lock.locked()
        await lock.release()

    async def test_release_without_acquire_raises_runtime_error(
        self, state: State, key: str
    ) -> None:
        with pytest.raises(RuntimeError):
            await AsyncLock(state, key).release()

    async def test_release_twice_raises_runtime_error(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        await lock.acquire()
        await lock.release()
        with pytest.raises(RuntimeError):
            await lock.release()

    async def test_acquire_from_another_task_while_held_raises_runtime_error(
        self, state: State, key: str
    ) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        await lock.acquire()
        intruder = asyncio.create_task(lock.acquire(blocking=False))
        assert isinstance(await finish(intruder), RuntimeError)
        await lock.release()


BAD_TTLS = [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf]


class TestBadInput:
    @pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
    async def test_bad_ttl_raises_value_error_naming_it(
        self, state: State, key: str, ttl: float
    ) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(ttl))):
            AsyncLock(state, key, ttl=ttl)

    @pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
    async def test_bad_extend_ttl_raises_value_error(
        self, state: State, key: str, ttl: float
    ) -> None:
        async with AsyncLock(state, key, ttl=10.0) as lock:
            with pytest.raises(ValueError, match=re.escape(repr(ttl))):
                await lock.extend(ttl)
            assert lock.owned

    async def test_empty_key_raises_value_error(self, state: State) -> None:
        with pytest.raises(ValueError, match="key"):
            AsyncLock(state, "")

    @pytest.mark.parametrize("timeout", [-0.1, -1, math.nan], ids=repr)
    async def test_bad_timeout_raises_value_error(
        self, state: State, key: str, timeout: float
    ) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(timeout))):
            AsyncLock(state, key, timeout=timeout)
        with pytest.raises(ValueError, match=re.escape(repr(timeout))):
            await AsyncLock(state, key).acquire(timeout=timeout)
        assert await is_free(state, key)

    @pytest.mark.parametrize("max_lifetime", [0, -1, math.nan], ids=repr)
    async def test_bad_max_lifetime_raises_value_error(
        self, state: State, key: str, max_lifetime: float
    ) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(max_lifetime))):
            AsyncLock(state, key, auto_renew=True, max_lifetime=max_lifetime)

    @pytest.mark.parametrize(
        ("kwargs", "bad"),
        [
            ({"key": 42}, "42"),
            ({"key": b"bytes"}, "b'bytes'"),
            ({"key": None}, "None"),
            ({"ttl": "30"}, "'30'"),
            ({"ttl": True}, "True"),
            ({"timeout": "1"}, "'1'"),
        ],
        ids=["int-key", "bytes-key", "none-key", "str-ttl", "bool-ttl", "str-timeout"],
    )
    async def test_wrong_types_raise_type_error(
        self, state: State, key: str, kwargs: dict[str, object], bad: str
    ) -> None:
        make: Any = AsyncLock
        with pytest.raises(TypeError, match=re.escape(bad)):
            make(state, **{"key": key, **kwargs})


class TestYieldsToTheLoop:
    async def test_every_lock_method_yields(self, state: State, key: str) -> None:
        lock = AsyncLock(state, key, ttl=10.0)
        other = AsyncLock(state, key, ttl=10.0)
        async with LoopTicker() as ticker:
            assert await ticker.assert_yields(lock.acquire(), "acquire")
            assert not await ticker.assert_yields(
                other.acquire(blocking=False), "acquire(blocking=False) against a holder"
            )
            await ticker.assert_yields(lock.extend(), "extend")
            assert await ticker.assert_yields(lock.locked(), "locked")
            await ticker.assert_yields(lock.release(), "release")
            assert not await ticker.assert_yields(lock.locked(), "locked on a free key")
            await ticker.assert_yields(lock.__aenter__(), "async with (enter)")
            await ticker.assert_yields(lock.__aexit__(None, None, None), "async with (exit)")
