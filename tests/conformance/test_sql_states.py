"""What only the SQL states promise: odd keys, tokens across purges, options, unreachable servers."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, Deduper, StateUnavailableError, state_from_url
from tests._helpers import token_of
from tests._matrix import MYSQL, POSTGRES, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import State
    from tests._matrix import Backend

SQL = [
    pytest.param(POSTGRES, id="postgres", marks=pytest.mark.postgres),
    pytest.param(MYSQL, id="mysql", marks=pytest.mark.mysql),
]
SECRET = "s3cr3t-Pa55"


@pytest.fixture(params=SQL)
def sql_backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.param
    require(chosen)
    return chosen


@pytest.fixture
async def sql_state(sql_backend: Backend) -> AsyncIterator[State]:
    from tests._matrix import purge_namespace

    namespace = uuid.uuid4().hex
    state = state_from_url(sql_backend.url, **sql_backend.options(namespace))
    try:
        yield state
    finally:
        await state.aclose()
        await purge_namespace(sql_backend, namespace)


ODD_KEYS = [
    "quote ' double \" back \\ slash",
    "'; DROP TABLE asynclock_locks; --",
    "ünïcödé 锁 🔒",
    "percent %s %(name)s {prefix}",
    "x" * 1024,
    "y" * 10_000,
    "new\nline\ttab",
]


@pytest.mark.parametrize("key", ODD_KEYS, ids=range(len(ODD_KEYS)))
async def test_any_key_is_just_a_key(sql_state: State, key: str) -> None:
    async with AsyncLock(sql_state, key, ttl=10.0) as lock:
        info = await sql_state.inspect(key)
        assert info is not None
        assert (info.key, info.owner, info.token) == (key, lock.owner, lock.token)
        assert not await AsyncLock(sql_state, key + "!").locked()
    assert await sql_state.inspect(key) is None
    dedupe = Deduper(sql_state, ttl=10.0)
    assert await dedupe.first_seen(key)
    assert not await dedupe.first_seen(key)


async def test_tokens_keep_increasing_after_the_row_is_purged(sql_backend: Backend) -> None:
    namespace = uuid.uuid4().hex
    state = state_from_url(sql_backend.url, **sql_backend.options(namespace), token_retention=0.001)
    try:
        lock = AsyncLock(state, "k", ttl=10.0)
        tokens = []
        for _ in range(3):
            async with lock:
                tokens.append(token_of(lock))
        await asyncio.sleep(0.01)
        purge = getattr(state, "purge_expired")  # noqa: B009 - SQL states only
        assert await purge() >= 1
        async with lock:
            tokens.append(token_of(lock))
        assert tokens == sorted(set(tokens)), tokens
    finally:
        await state.aclose()


async def test_expired_dedupe_records_are_purged(sql_state: State) -> None:
    dedupe = Deduper(sql_state, ttl=0.05)
    assert await dedupe.first_seen("evt")
    await asyncio.sleep(0.1)
    purge = getattr(sql_state, "purge_expired")  # noqa: B009 - SQL states only
    assert await purge() >= 1
    assert await dedupe.first_seen("evt")


@pytest.mark.parametrize(
    "url",
    [f"postgresql://u:{SECRET}@127.0.0.1:1/db", f"mysql://u:{SECRET}@127.0.0.1:1/db"],
    ids=["postgres", "mysql"],
)
async def test_unreachable_server_raises_state_unavailable_in_time(url: str) -> None:
    state = state_from_url(url, connect_timeout=0.5, op_timeout=0.5)
    assert SECRET not in repr(state)
    try:
        start = time.monotonic()
        with pytest.raises(StateUnavailableError) as caught:
            await AsyncLock(state, "k", ttl=5.0).acquire(timeout=30.0)
        assert time.monotonic() - start < 2.0
        assert caught.value.__cause__ is not None
        assert SECRET not in str(caught.value)
    finally:
        await state.aclose()


async def test_schema_and_table_prefix_options(sql_backend: Backend) -> None:
    with pytest.raises(ValueError, match="table_prefix"):
        state_from_url(sql_backend.url, table_prefix="bad-name;")
    state = state_from_url(sql_backend.url, create_schema=False, table_prefix="nope_missing_")
    try:
        with pytest.raises(Exception, match="nope_missing_locks"):
            await state.inspect("k")
    finally:
        await state.aclose()
