"""Hostile keys and TTLs on every backend (issue #7): they work, or are refused clearly, and
nothing is left held.

The ``state`` fixture gives one state per backend and test; Hypothesis runs its examples on it
(pytest-asyncio drives each example in the test's event loop). Examples share the state, so each
one must leave its keys free: that is the property. Dedupe records use a fresh namespace per
example, so a record of an earlier (or a shrunk, failing) example never changes the answer.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, given, settings

from asynclock import AsyncLock, Deduper, LockNotOwnedError
from tests.security._hostile import (
    error_kind,
    key_is_valid,
    keys,
    names_value,
    seconds,
    ttl_is_valid,
)

if TYPE_CHECKING:
    from asynclock import State

ON_EACH_BACKEND = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


async def assert_free(state: State, key: str) -> None:
    assert not await AsyncLock(state, key).locked(), f"{key[:40]!r} is still held"
    probe = AsyncLock(state, key, ttl=5.0)
    assert await probe.acquire(blocking=False), f"a fresh acquire of {key[:40]!r} failed"
    await probe.release()


@ON_EACH_BACKEND
@given(key=keys())
async def test_hostile_keys_lock_and_dedupe(state: State, key: str) -> None:
    kind = error_kind(key, key_is_valid)
    dedupe = Deduper(state, ttl=30.0, namespace=f"n{uuid.uuid4().hex[:8]}")
    if kind is not None:
        with pytest.raises(kind) as caught:
            AsyncLock(state, key)
        assert names_value(str(caught.value), key), str(caught.value)[:300]
        with pytest.raises(kind):
            await dedupe.first_seen(key)
        with pytest.raises(kind):
            async with dedupe.claim(key):
                pytest.fail("entered a claim of an invalid id")
        return
    lock = AsyncLock(state, key, ttl=30.0)
    try:
        assert await lock.acquire(blocking=False)
        assert await AsyncLock(state, key).locked()
        assert not await AsyncLock(state, key, ttl=5.0).acquire(blocking=False)
        info = await state.inspect(key)
        assert info is not None
        assert info.owner == lock.owner
    finally:
        if lock.owned:
            await lock.release()
    await assert_free(state, key)

    assert await dedupe.first_seen(key)
    assert not await dedupe.first_seen(key)
    assert await dedupe.forget(key)
    async with dedupe.claim(key) as fresh:
        assert fresh
    assert await dedupe.forget(key)


@ON_EACH_BACKEND
@given(ttl=seconds())
async def test_hostile_ttls(state: State, ttl: object) -> None:
    anything: Any = ttl
    key = "ttl-probe"
    kind = error_kind(ttl, ttl_is_valid)
    if kind is not None:
        with pytest.raises(kind) as caught:
            AsyncLock(state, key, ttl=anything)
        assert names_value(str(caught.value), ttl), str(caught.value)
        with pytest.raises(kind):
            Deduper(state, ttl=anything)
        holder = AsyncLock(state, key, ttl=30.0)
        assert await holder.acquire(blocking=False)
        if ttl is not None:  # extend(None) means "the lock's own ttl"
            with pytest.raises(kind):
                await holder.extend(anything)
        assert await AsyncLock(state, key).locked(), "a refused extend changed the lock"
        await holder.release()
        await assert_free(state, key)
        return
    seconds_ = float(anything)
    lock = AsyncLock(state, key, ttl=anything)
    assert await lock.acquire(blocking=False)
    if seconds_ >= 2.0:
        assert await AsyncLock(state, key).locked()
        await lock.extend(anything)
    try:
        await lock.release()
    except LockNotOwnedError:  # a TTL of a few milliseconds may run out before the release
        assert seconds_ < 2.0
    await assert_free(state, key)
    dedupe = Deduper(state, ttl=anything, namespace=f"n{uuid.uuid4().hex[:8]}")
    assert await dedupe.first_seen("evt")
    if seconds_ >= 2.0:
        assert not await dedupe.first_seen("evt")
    await dedupe.forget("evt")
