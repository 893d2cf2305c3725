"""Entry point of the worker process that ``test_crash.py`` kills with SIGKILL.

Imported by a *spawned* interpreter: only asynclock here, no pytest. The worker takes every
lock it is given (auto-renewed, like a long handler) and claims every dedupe id, tells the
parent it holds them all, then waits to be killed. It never releases anything on its own.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from asynclock import AsyncLock, Deduper, RedisState

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event

#: the dedupe TTL the worker claims with: far longer than any test waits
DEDUPE_TTL = 600.0


def hold_until_killed(
    url: str, prefix: str, keys: list[str], event_ids: list[str], ttl: float, ready: Event
) -> None:
    asyncio.run(_hold(url, prefix, keys, event_ids, ttl, ready))


async def _hold(
    url: str, prefix: str, keys: list[str], event_ids: list[str], ttl: float, ready: Event
) -> None:
    state = RedisState.from_url(url, prefix=prefix, op_timeout=1.0, connect_timeout=1.0)
    dedupe = Deduper(state, ttl=DEDUPE_TTL, namespace="events", lease=ttl)
    held = 0
    all_held = asyncio.Event()

    async def handle(key: str, event_id: str) -> None:
        nonlocal held
        async with AsyncLock(state, key, ttl=ttl, auto_renew=True), dedupe.claim(event_id) as fresh:
            assert fresh, f"{event_id} was claimed already"
            held += 1
            if held == len(keys):
                all_held.set()
            await asyncio.Event().wait()  # a handler that runs until the process dies

    tasks = [asyncio.create_task(handle(k, e)) for k, e in zip(keys, event_ids, strict=True)]
    await all_held.wait()
    ready.set()
    print(f"worker {os.getpid()} holds {len(keys)} locks", flush=True)
    await asyncio.gather(*tasks)
