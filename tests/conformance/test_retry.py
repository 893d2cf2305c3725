"""``retry_on_lock_conflict`` against real locks, on every backend (SPEC section 4).

A holder takes the lock first (through ``peer_state``: another client, as another process would
be); the decorated coroutine enters ``AsyncLock(state, key, blocking=False)`` and meets it.
The decorator's own rules (wait forms, validation, counters) are pinned without a backend in
``tests/unit/test_retry_policies.py``. Waits are tens of milliseconds with generous upper
bounds; where a test must know a conflict happened, it waits for the decorator's counters, never
for a fixed time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import pytest

from asynclock import (
    AsyncLock,
    LockAcquisitionError,
    LockNotOwnedError,
    RetryStatistics,
    retry_on_lock_conflict,
)
from asynclock.cli._storm import MemoryConversations, run_storm, storm_handler, tally
from tests._helpers import eventually, finish
from tests.support.storm import storm_messages

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import State
    from asynclock.cli._storm import StormTally, Variant


def statistics_of(function: object) -> RetryStatistics:
    stats = getattr(function, "statistics")()  # noqa: B009 - set by the decorator
    assert isinstance(stats, RetryStatistics)
    return stats


class Holder:
    """Someone else holding a key for 10 s, from a task of its own (a lock belongs to the task
    that acquired it, and a pytest fixture's set-up task ends before the test starts)."""

    def __init__(self, state: State, key: str) -> None:
        self.lock = AsyncLock(state, key, ttl=10.0)
        self._acquired = asyncio.Event()
        self._done = asyncio.Event()
        self._task = asyncio.create_task(self._hold())

    async def _hold(self) -> None:
        assert await self.lock.acquire(blocking=False)
        self._acquired.set()
        await self._done.wait()
        if self.lock.owned:
            await self.lock.release()

    async def started(self) -> Holder:
        await asyncio.wait_for(self._acquired.wait(), 10.0)
        return self

    async def release(self) -> None:
        self._done.set()
        await asyncio.wait_for(self._task, 10.0)

    @property
    def key(self) -> str:
        return self.lock.key

    @property
    def owner(self) -> str:
        return self.lock.owner

    @property
    def token(self) -> int | None:
        return self.lock.token


@pytest.fixture
async def holder(peer_state: State, key: str) -> AsyncIterator[Holder]:
    """Someone else holding ``key`` (through another client); released afterwards."""
    held = await Holder(peer_state, key).started()
    yield held
    await held.release()


async def holder_untouched(state: State, holder: Holder) -> bool:
    """The holder still owns its lock, with its token, per the server."""
    info = await state.inspect(holder.key)
    return (
        info is not None
        and info.owner == holder.owner
        and info.token == holder.token
        and holder.lock.owned
    )


class TestRetryAgainstAHolder:
    async def test_attempts_counts_executions_against_a_held_lock(
        self, state: State, key: str, holder: Holder
    ) -> None:
        executions = 0

        @retry_on_lock_conflict(wait=0.01, attempts=3)
        async def handle() -> None:
            nonlocal executions
            executions += 1
            async with AsyncLock(state, key, ttl=5.0, blocking=False):
                raise AssertionError("the holder still holds it")

        with pytest.raises(LockAcquisitionError) as raised:
            await handle()
        assert executions == 3
        assert raised.value.key == key
        assert await holder_untouched(state, holder)

    async def test_retries_until_the_holder_releases(
        self, state: State, key: str, holder: Holder
    ) -> None:
        @retry_on_lock_conflict(wait=0.02, attempts=50)
        async def handle() -> int:
            async with AsyncLock(state, key, ttl=5.0, blocking=False) as lock:
                assert lock.owned
                assert not lock.granted
                token = lock.token
                assert token is not None
                return token

        task = asyncio.create_task(handle())
        await eventually(lambda: _true(statistics_of(handle).conflicts >= 1), within=5.0)
        await holder.release()
        token = await asyncio.wait_for(task, 5.0)
        holder_token = holder.token
        assert holder_token is not None
        assert token > holder_token
        stats = statistics_of(handle)
        assert stats.exhausted == 0
        assert stats.retries == stats.conflicts >= 1

    async def test_wait_lock_ttl_waits_out_the_holders_remaining_ttl(
        self, state: State, peer_state: State, key: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.INFO, logger="asynclock")
        # long enough that the first attempt meets it held on a loaded machine (at 0.3 s it had
        # sometimes expired before the call began: no conflict, nothing to wait out)
        ttl = 1.0
        short = AsyncLock(peer_state, key, ttl=ttl)
        before_acquire = time.time()
        assert await short.acquire(blocking=False)  # and never released: it expires

        @retry_on_lock_conflict(wait="lock_ttl", attempts=3)
        async def handle() -> bool:
            async with AsyncLock(state, key, ttl=5.0, blocking=False) as lock:
                return lock.owned

        started = time.monotonic()
        assert await asyncio.wait_for(handle(), 10.0)
        elapsed = time.monotonic() - started
        retries = [r for r in caplog.records if hasattr(r, "wait")]
        assert retries, "no conflict was logged"
        waited: float = getattr(retries[0], "wait")  # noqa: B009 - a logging extra
        # the holder's remaining TTL when the conflict was logged, at most (never our 5 s TTL)
        remaining_at_most = ttl - (retries[0].created - before_acquire)
        assert remaining_at_most - 0.02 <= waited <= ttl + 0.005, (waited, remaining_at_most)
        assert waited - 0.005 <= elapsed < 3.0
        with pytest.raises(LockNotOwnedError):
            await short.release()


class TestExhaustion:
    async def test_drop_returns_none_and_leaves_the_holder_alone(
        self, state: State, key: str, holder: Holder
    ) -> None:
        @retry_on_lock_conflict(wait=0.01, attempts=2, on_exhaustion="drop")
        async def handle() -> str:
            async with AsyncLock(state, key, ttl=5.0, blocking=False):
                return "processed"

        assert await handle() is None
        assert statistics_of(handle) == RetryStatistics(
            calls=1, conflicts=2, retries=1, exhausted=1, dropped=1
        )
        assert await holder_untouched(state, holder)

    async def test_a_callable_gets_the_original_arguments(
        self, state: State, key: str, holder: Holder
    ) -> None:
        dead_letters: list[tuple[object, ...]] = []

        async def dead_letter(entries: list[str], *, account: str) -> str:
            dead_letters.append((entries, account))
            return "dead-lettered"

        @retry_on_lock_conflict(wait=0.01, attempts=2, on_exhaustion=dead_letter)
        async def handle(entries: list[str], *, account: str) -> str:
            async with AsyncLock(state, key, ttl=5.0, blocking=False):
                return "processed"

        entries = ["m1", "m2"]
        assert await handle(entries, account="acme") == "dead-lettered"
        assert dead_letters == [(entries, "acme")]
        assert await holder_untouched(state, holder)


class TestProcessWithoutLock:
    async def test_the_last_run_is_granted_and_the_holder_keeps_its_lock(
        self, state: State, key: str, holder: Holder
    ) -> None:
        runs: list[tuple[bool, bool]] = []

        @retry_on_lock_conflict(wait=0.01, attempts=2, on_exhaustion="process_without_lock")
        async def handle(message: str) -> str:
            async with AsyncLock(state, key, ttl=5.0, blocking=False) as lock:
                runs.append((lock.granted, lock.owned))
                info = await state.inspect(key)  # the state is untouched
                assert info is not None
                assert info.owner == holder.owner
                await lock.extend()  # no-ops on a granted lock
                return f"processed {message}"

        assert await handle("m1") == "processed m1"
        assert runs == [(True, False)]  # two conflicts, then the granted run
        assert await holder_untouched(state, holder)
        await holder.lock.extend()  # the real holder goes on as if nothing happened
        stats = statistics_of(handle)
        assert (stats.exhausted, stats.processed_without_lock) == (1, 1)

    async def test_an_explicit_acquire_is_granted_too(
        self, state: State, key: str, holder: Holder
    ) -> None:
        granted: list[bool] = []

        @retry_on_lock_conflict(wait=0.0, attempts=1, on_exhaustion="process_without_lock")
        async def handle() -> None:
            lock = AsyncLock(state, key, ttl=5.0, blocking=False)
            if not await lock.acquire():
                raise LockAcquisitionError(key, 5.0, lock.retry_after)
            granted.append(lock.granted)
            assert not lock.owned
            await lock.release()  # does nothing to the holder

        await handle()
        assert granted == [True]
        assert await holder_untouched(state, holder)

    async def test_the_grant_reaches_the_tasks_the_call_starts(
        self, state: State, key: str, holder: Holder
    ) -> None:
        children: list[tuple[bool, bool]] = []

        async def child(suffix: str) -> None:
            # blocking, no timeout: were it not granted, it would wait for the holder's TTL
            async with AsyncLock(state, key + suffix if suffix else key, ttl=5.0) as lock:
                children.append((lock.granted, lock.owned))

        @retry_on_lock_conflict(wait=0.0, attempts=1, on_exhaustion="process_without_lock")
        async def handle() -> None:
            async with AsyncLock(state, key, ttl=5.0, blocking=False):
                await asyncio.gather(child(""), child(":other"))
                await asyncio.create_task(child(""))

        await asyncio.wait_for(handle(), 5.0)
        assert children == [(True, False)] * 3
        assert await holder_untouched(state, holder)
        assert await state.inspect(key + ":other") is None  # granted, so never written

    async def test_the_grant_never_leaks_to_concurrent_tasks(
        self, state: State, key: str, holder: Holder
    ) -> None:
        inside = asyncio.Event()
        proceed = asyncio.Event()

        @retry_on_lock_conflict(wait=0.0, attempts=1, on_exhaustion="process_without_lock")
        async def handle() -> bool:
            async with AsyncLock(state, key, ttl=5.0, blocking=False) as lock:
                inside.set()
                await proceed.wait()
                return lock.granted

        async def bystander(which: str) -> tuple[bool, bool, bool]:
            """(got the held key?, granted?, really owns a free key?)"""
            await inside.wait()
            held = AsyncLock(state, key, ttl=5.0)
            got_held = await held.acquire(blocking=False)
            free = AsyncLock(state, f"{key}:{which}", ttl=5.0)
            assert await free.acquire(blocking=False)
            info = await state.inspect(f"{key}:{which}")
            really = free.owned and info is not None and info.owner == free.owner
            granted = held.granted or free.granted
            await free.release()
            return got_held, granted, really

        before = asyncio.create_task(bystander("before"))  # started before the call
        call = asyncio.create_task(handle())
        await inside.wait()
        during = asyncio.create_task(bystander("during"))  # started while it runs granted
        results = list(await asyncio.wait_for(asyncio.gather(before, during), 5.0))
        proceed.set()
        assert await asyncio.wait_for(call, 5.0) is True
        assert results == [(False, False, True), (False, False, True)]
        assert await holder_untouched(state, holder)

    async def test_the_grant_ends_with_the_call(
        self, state: State, key: str, holder: Holder
    ) -> None:
        runs: list[bool] = []

        @retry_on_lock_conflict(wait=0.0, attempts=2, on_exhaustion="process_without_lock")
        async def handle() -> None:
            lock = AsyncLock(state, key, ttl=5.0, blocking=False)
            got = await lock.acquire()
            runs.append(lock.granted)
            if not got:
                raise LockAcquisitionError(key, 5.0, lock.retry_after)
            await lock.release()

        await handle()
        after = AsyncLock(state, key, ttl=5.0)
        assert not await after.acquire(blocking=False)  # same task, later: not granted
        assert not after.granted
        await handle()  # a later call goes through its attempts again
        assert runs == [False, False, True, False, False, True]
        assert statistics_of(handle).processed_without_lock == 2
        assert await holder_untouched(state, holder)

    async def test_a_cancelled_granted_run_resets_the_grant(
        self, state: State, key: str, holder: Holder
    ) -> None:
        inside = asyncio.Event()

        @retry_on_lock_conflict(wait=0.0, attempts=1, on_exhaustion="process_without_lock")
        async def handle() -> None:
            async with AsyncLock(state, key, ttl=5.0, blocking=False):
                inside.set()
                await asyncio.sleep(30.0)

        task = asyncio.create_task(handle())
        await inside.wait()
        task.cancel()
        assert isinstance(await asyncio.wait_for(finish(task), 5.0), asyncio.CancelledError)
        probe = AsyncLock(state, key, ttl=5.0)
        assert not await probe.acquire(blocking=False)
        assert await holder_untouched(state, holder)


class TestStormInOneProcess:
    """The webhook storm of ``asynclock.cli._storm`` in one process (the demo's scenario)."""

    async def test_no_lock_creates_duplicates(self, state: State) -> None:
        counted = await self._storm(state, "no lock")
        assert counted.duplicates > 0, counted
        assert (counted.lost, counted.processed_twice) == (0, 0), counted

    async def test_lock_without_retry_loses_messages(self, state: State) -> None:
        counted = await self._storm(state, "lock, no retry")
        assert counted.lost > 0, counted
        assert (counted.duplicates, counted.processed_twice) == (0, 0), counted

    async def test_retry_with_process_without_lock_neither_duplicates_nor_loses(
        self, state: State
    ) -> None:
        counted = await self._storm(state, "lock + retry")
        assert (counted.duplicates, counted.lost, counted.processed_twice) == (0, 0, 0), counted
        assert counted.retry is not None
        assert counted.retry.processed_without_lock > 0, counted

    @staticmethod
    async def _storm(state: State, variant: Variant) -> StormTally:
        db = MemoryConversations()
        messages = storm_messages(contacts=8, per_contact=5, seed=11)
        handler = storm_handler(
            variant,
            state,
            db,
            ttl=0.6,
            gap=0.03,
            wait=lambda n: 0.2 * n,
            attempts=3,
            lock_ttl=0.6,
        )
        processed, wall_time = await asyncio.wait_for(run_storm(handler, messages), 20.0)
        counted = await tally(
            db, messages, variant, wall_time, handler.statistics(), len(handler.overran)
        )
        assert counted.overran == 0, f"a holder outlived its 0.6 s TTL: {counted}"
        assert processed == counted.messages - counted.lost
        return counted


async def _true(value: bool) -> bool:
    return value
