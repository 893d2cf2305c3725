"""Bursts larger than the connection pool queue for a connection instead of failing."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, Deduper, RedisState
from tests._matrix import REDIS, purge_namespace, require
from tests.conftest import Target, new_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.redis


@pytest.fixture
async def redis_target() -> AsyncIterator[Target]:
    require(REDIS)  # RedisState's own pool is under test, not a matrix property
    made = Target(REDIS, new_namespace())
    yield made
    await purge_namespace(REDIS, made.namespace)


async def test_500_concurrent_operations_queue_on_a_small_pool(redis_target: Target) -> None:
    state = RedisState.from_url(redis_target.url, max_connections=8, prefix=_prefix(redis_target))
    async with state:
        dedupe = Deduper(state, ttl=60.0)
        ids = [uuid.uuid4().hex for _ in range(500)]
        results = await asyncio.gather(*(dedupe.first_seen(i) for i in ids))
        assert results == [True] * 500
        assert state._pool.opened <= 8  # the burst waited for connections, none failed


async def test_500_concurrent_lock_cycles_on_a_small_pool(redis_target: Target) -> None:
    state = RedisState.from_url(redis_target.url, max_connections=4, prefix=_prefix(redis_target))
    async with state:

        async def cycle(i: int) -> int:
            async with AsyncLock(state, f"burst-{i % 50}", ttl=10.0) as lock:
                assert lock.token is not None
                return lock.token

        tokens = await asyncio.gather(*(cycle(i) for i in range(500)))
        assert len(tokens) == 500
        assert state._pool.opened <= 4


def _prefix(target: Target) -> str:
    prefix = target.options["prefix"]
    assert isinstance(prefix, str)
    return prefix
