"""The contenders of the contended workloads, shared by every scenario and child process.

A contender is one way to take and give back the lock under test (``_contend.Contender``).
The lock-based ones build a new lock object per cycle, as a user does per critical section.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis.asyncio


class AsyncioLockContender:
    """One ``asyncio.Lock`` for every cycle: the in-process ideal."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()

    async def acquire(self) -> Any:
        await self.lock.acquire()

    async def release(self, handle: Any) -> None:
        self.lock.release()


class AsynclockContender:
    """A new ``lock_cls(state, key, ttl=30.0)`` (asynclock's ``AsyncLock``) per cycle."""

    def __init__(self, lock_cls: Any, state: Any, key: str) -> None:
        self.lock_cls, self.state, self.key = lock_cls, state, key

    async def acquire(self) -> Any:
        lock = self.lock_cls(self.state, self.key, ttl=30.0)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


class RedisPyContender:
    """A new redis-py asyncio ``Lock`` (timeout 30 s, polling every ``sleep`` s) per cycle.

    ``sleep=0.1`` is redis-py's own default.
    """

    def __init__(self, client: redis.asyncio.Redis, key: str, sleep: float = 0.1) -> None:
        self.client, self.key, self.sleep = client, key, sleep

    async def acquire(self) -> Any:
        lock = self.client.lock(self.key, timeout=30, sleep=self.sleep)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()
