"""The primitives work on every asyncio event loop flavour: the default loop and uvloop."""

from __future__ import annotations

import asyncio
import sys
import uuid

import pytest

from asynclock import AsyncLock, Deduper, MemoryState, state_from_url
from tests._matrix import REDIS, require

uvloop = pytest.importorskip("uvloop") if sys.platform != "win32" else None


async def _scenario(url: str) -> tuple[int, int, list[bool]]:
    prefix = {"prefix": f"asynclock-test:{uuid.uuid4().hex}:"} if url != "memory://" else {}
    async with state_from_url(url, **prefix) as state:
        inside = most = 0

        async def worker() -> None:
            nonlocal inside, most
            for _ in range(20):
                async with AsyncLock(state, "flavour", ttl=5.0):
                    inside += 1
                    most = max(most, inside)
                    await asyncio.sleep(0)
                    inside -= 1

        await asyncio.gather(*(worker() for _ in range(8)))
        dedupe = Deduper(state, ttl=5.0)
        seen = await asyncio.gather(*(dedupe.first_seen("same") for _ in range(10)))
        token_probe = AsyncLock(state, "flavour", ttl=5.0)
        async with token_probe:
            token = token_probe.token
        assert token is not None
        return most, token, seen


@pytest.mark.parametrize("url", ["memory://", pytest.param(REDIS.url, marks=pytest.mark.redis)])
def test_uvloop(url: str) -> None:
    if url != "memory://":
        require(REDIS)
    assert uvloop is not None
    most, _, seen = uvloop.run(_scenario(url))
    assert most == 1
    assert seen.count(True) == 1


def test_default_loop_in_a_fresh_runner() -> None:
    most, _, seen = asyncio.run(_scenario("memory://"))
    assert most == 1
    assert seen.count(True) == 1


def test_memory_state_outlives_its_event_loop() -> None:
    # A MemoryState made in one asyncio.run() keeps working in the next one.
    state = MemoryState()

    async def hold_and_check() -> bool:
        async with AsyncLock(state, "k", ttl=5.0):
            return await AsyncLock(state, "k").locked()

    assert asyncio.run(hold_and_check())
    assert asyncio.run(hold_and_check())
