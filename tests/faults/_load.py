"""The load a fault test keeps on a state while it breaks the server: every call timed.

``Load`` runs ``tasks`` tasks, each looping over its own key: a non-blocking ``acquire`` (and the
``release`` when it got the lock), then ``Deduper.first_seen`` of a fresh id. Every call lands in
``calls`` (``_timing.timed``), so the test can say which calls failed, how, and when.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import TYPE_CHECKING

from asynclock import AsyncLock, Deduper
from tests.faults._timing import Call, bounded, timed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock.state import State


class Load:
    """Start with ``Load(state)`` (inside a running loop); end with ``await load.stop()``."""

    def __init__(self, state: State, tasks: int = 8) -> None:
        self.calls: list[Call] = []
        self._state = state
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(self._loop(n)) for n in range(tasks)]

    async def _loop(self, n: int) -> None:
        dedupe = Deduper(self._state, ttl=60.0, namespace=f"load{n}")
        round_ = 0
        while not self._stop.is_set():
            round_ += 1
            lock = AsyncLock(self._state, f"load-{n}", ttl=2.0)
            if await timed(self.calls, "acquire", partial(lock.acquire, blocking=False)):
                await timed(self.calls, "release", lock.release)
            await timed(self.calls, "first_seen", partial(dedupe.first_seen, f"evt-{round_}"))
            await asyncio.sleep(0.002)  # pacing only

    def succeeded_since(self, moment: float, count: int) -> Callable[[], Awaitable[bool]]:
        """A predicate for ``until``: ``count`` calls started at ``moment`` or later worked."""

        async def check() -> bool:
            return sum(c.error is None and c.start >= moment for c in self.calls) >= count

        return check

    def failed_since(self, moment: float) -> Callable[[], Awaitable[bool]]:
        """A predicate for ``until``: a call started at ``moment`` or later failed."""

        async def check() -> bool:
            return any(c.error is not None and c.start >= moment for c in self.calls)

        return check

    @property
    def failed(self) -> list[Call]:
        """The calls that failed, in the order they ended."""
        return [c for c in self.calls if c.error is not None]

    async def stop(self) -> None:
        """Stop every task after its current round (bounded: a hang fails the test)."""
        self._stop.set()
        await bounded(asyncio.gather(*self._tasks), "the load tasks", 5.0)
