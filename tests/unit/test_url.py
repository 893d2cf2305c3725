"""``state_from_url``: picking the backend by scheme, passing options, never showing passwords."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from asynclock import AsyncLock, MemoryState, RedisState, state_from_url
from tests._matrix import REDIS, TEST_PREFIX, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

KNOWN_SCHEMES = ("memory", "redis", "rediss", "unix", "redis+cluster")
SECRET = "s3cr3t-Pa55"


@pytest.fixture
async def raw_redis() -> AsyncIterator[Redis]:
    require(REDIS)
    client = Redis.from_url(REDIS.url)
    try:
        yield client
    finally:
        await client.aclose()


class TestSchemes:
    async def test_memory(self) -> None:
        state = state_from_url("memory://")
        assert isinstance(state, MemoryState)
        await state.aclose()

    @pytest.mark.parametrize(
        "url",
        [
            "redis://127.0.0.1:6379/0",
            "rediss://127.0.0.1:6380/0",
            "unix:///var/run/redis/redis.sock",
            "redis+cluster://127.0.0.1:7000",
        ],
    )
    async def test_redis_family(self, url: str) -> None:
        # Building a state does not connect: these servers need not exist.
        state = state_from_url(url)
        assert isinstance(state, RedisState)
        await state.aclose()

    async def test_state_is_an_async_context_manager(self) -> None:
        state = state_from_url("memory://")
        async with state as entered:
            assert entered is state

    @pytest.mark.parametrize("url", ["foo://x", "http://127.0.0.1:6379", "mongodb://h/db"])
    def test_unknown_scheme_names_the_known_ones(self, url: str) -> None:
        with pytest.raises(ValueError) as caught:
            state_from_url(url)
        message = str(caught.value)
        assert url.split("://", 1)[0] in message
        for scheme in KNOWN_SCHEMES:
            assert scheme in message, (scheme, message)

    @pytest.mark.parametrize("url", ["", "127.0.0.1:6379", "no scheme at all"])
    def test_missing_scheme_is_a_value_error(self, url: str) -> None:
        with pytest.raises(ValueError):
            state_from_url(url)


class TestOptions:
    async def test_prefix_option_reaches_the_redis_keys(self, raw_redis: Redis) -> None:
        namespace = uuid.uuid4().hex
        prefix = f"{TEST_PREFIX}{namespace}:"
        state = state_from_url(REDIS.url, prefix=prefix)
        async with state, AsyncLock(state, "the-key", ttl=10.0):
            keys = [k async for k in raw_redis.scan_iter(match=f"*{namespace}*")]
            assert keys
            assert all(k.decode().startswith(prefix) for k in keys), keys
            assert any(b"the-key" in k for k in keys)
        leftovers = [k async for k in raw_redis.scan_iter(match=f"*{namespace}*")]
        if leftovers:
            await raw_redis.delete(*leftovers)

    async def test_default_prefix_is_asynclock(self, raw_redis: Redis) -> None:
        key = f"{TEST_PREFIX}{uuid.uuid4().hex}"
        state = RedisState.from_url(REDIS.url)
        async with state, AsyncLock(state, key, ttl=10.0):
            keys = [k async for k in raw_redis.scan_iter(match=f"*{key}*")]
            assert any(k.decode().startswith("asynclock:") for k in keys), keys
        leftovers = [k async for k in raw_redis.scan_iter(match=f"*{key}*")]
        if leftovers:
            await raw_redis.delete(*leftovers)

    async def test_state_given_a_client_does_not_close_it(self, raw_redis: Redis) -> None:
        namespace = uuid.uuid4().hex
        state = RedisState(raw_redis, prefix=f"{TEST_PREFIX}{namespace}:")
        async with state, AsyncLock(state, "k", ttl=5.0):
            pass
        assert await raw_redis.ping()


class TestReprHidesPasswords:
    @pytest.mark.parametrize(
        "url",
        [
            f"redis://user:{SECRET}@127.0.0.1:6379/0",
            f"redis://:{SECRET}@127.0.0.1:6379/0",
            f"rediss://default:{SECRET}@127.0.0.1:6380/0",
            f"redis://127.0.0.1:6379/0?password={SECRET}",
            f"redis+cluster://user:{SECRET}@127.0.0.1:7000",
        ],
    )
    async def test_repr_and_str_never_show_the_password(self, url: str) -> None:
        for state in (state_from_url(url), RedisState.from_url(url)):
            try:
                assert SECRET not in repr(state)
                assert SECRET not in str(state)
                assert "RedisState" in repr(state)
                assert SECRET not in repr(AsyncLock(state, "k"))
            finally:
                await state.aclose()

    async def test_unknown_scheme_error_does_not_show_the_password(self) -> None:
        with pytest.raises(ValueError) as caught:
            state_from_url(f"foo://user:{SECRET}@host/db")
        assert SECRET not in str(caught.value)
