"""The uncontended acquire+release loops that several scenarios time.

Each returns how many of its ``n`` pairs failed (a refused acquire or a release that found the
lock gone), so the caller can fail the row loudly instead of timing a broken loop. The hot loop
binds what it calls to locals first: an attribute lookup per pair would be timed too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import redis.asyncio

from benchmarks.harness.env import RELEASE_SCRIPT
from benchmarks.harness.scenario import Variant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


async def lock_pairs(lock_cls: Any, state: Any, key: str, n: int) -> int:
    """``n`` x a new ``lock_cls(state, key, ttl=30.0)``: ``acquire()`` then ``release()``."""
    misses = 0
    for _ in range(n):
        lock = lock_cls(state, key, ttl=30.0)
        if not await lock.acquire():
            misses += 1
        await lock.release()
    return misses


async def redis_floor_pairs(client: redis.asyncio.Redis, sha: str, key: str, n: int) -> int:
    """``n`` x ``SET key token NX PX 30000`` then ``EVALSHA`` of the release script ``sha``.

    The raw floor of a Redis lock: the two commands any such lock sends, nothing around them.
    """
    set_ = cast("Callable[..., Awaitable[Any]]", client.set)
    evalsha = cast("Callable[..., Awaitable[Any]]", client.evalsha)
    misses = 0
    for i in range(n):
        token = f"t{i}"
        if not await set_(key, token, nx=True, px=30000):
            misses += 1
        if not await evalsha(sha, 1, key, token):
            misses += 1
    return misses


class RedisFloor(Variant):
    """The raw floor of a Redis lock as a row: :func:`redis_floor_pairs` on one plain client."""

    def __init__(self, name: str, url: str, key: str) -> None:
        super().__init__()
        self.name, self.key, self.sha = name, key, ""
        self.client = redis.asyncio.Redis.from_url(url)

    async def setup(self) -> None:
        self.sha = await self.client.script_load(RELEASE_SCRIPT)

    async def loop(self, n: int) -> None:
        self.passed(await redis_floor_pairs(self.client, self.sha, self.key, n))

    async def teardown(self) -> None:
        await self.client.aclose()
