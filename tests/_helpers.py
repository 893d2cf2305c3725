"""Small tools shared by the tests: a fake clock, a loop-step counter, bounded waits."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import TYPE_CHECKING, Any, TypeVar, cast

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from typing_extensions import Self

    from asynclock.state import State

from asynclock import AsyncLock
from asynclock.state import MemoryState

T = TypeVar("T")

#: Long enough for a task started just before to reach its blocking wait, on a loaded machine
#: (a loopback round trip takes well under a millisecond). Only used to *order arrivals* or to
#: make sure a waiter is waiting; never to let a race resolve itself.
SETTLE = 0.1


class FakeClock:
    """A clock for ``MemoryState(clock=...)`` that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class LoopTicker:
    """Counts event-loop iterations from a background task (``count`` grows once per step).

    ``await ticker.assert_yields(coro)`` checks that awaiting ``coro`` gave the loop back at least
    once: a method that never yields would let the ticker stand still.
    """

    def __init__(self) -> None:
        self.count = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.count += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def assert_yields(self, awaitable: Awaitable[T], what: str) -> T:
        before = self.count
        result = await awaitable
        assert self.count > before, f"{what} never yielded to the event loop"
        return result


async def reply(value: Awaitable[T] | T) -> T:
    """What a ``redis.asyncio`` command answers, typed on every redis-py of the declared range.

    redis-py 5's annotations give one signature to the sync and async clients
    (``Awaitable[T] | T``); newer ones say ``Awaitable[T]``. ``await reply(client.get(k))``
    type-checks with both.
    """
    if inspect.isawaitable(value):
        return cast("T", await value)
    return value


async def eventually(
    predicate: Callable[[], Awaitable[bool]], *, within: float, interval: float = 0.01
) -> float:
    """Await ``predicate`` until it is true; return the seconds it took. Fails after ``within``."""
    start = time.monotonic()
    while not await predicate():
        if time.monotonic() - start > within:
            raise AssertionError(f"condition still false after {within} s")
        await asyncio.sleep(interval)
    return time.monotonic() - start


async def loop_steps(n: int) -> None:
    """Let the event loop run ``n`` iterations."""
    for _ in range(n):
        await asyncio.sleep(0)


async def finish(task: asyncio.Task[Any]) -> BaseException | None:
    """Wait for ``task`` to end; return its exception (``CancelledError`` included) or ``None``."""
    await asyncio.wait([task])
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception()


def owned(lock: AsyncLock) -> bool:
    """``lock.owned``, read fresh (a type checker would otherwise carry over an earlier check)."""
    return lock.owned


def token_of(lock: AsyncLock) -> int:
    """The fencing token of the lock's current or last acquisition (there must be one)."""
    token = lock.token
    assert token is not None, f"{lock!r} has no token"
    return token


class LocksOnly:
    """A third-party state with the State protocol and nothing else (every built-in state now
    has the inbox): the dispatcher must refuse the inbox on it, naming what is missing."""

    def __init__(self) -> None:
        self._inner = MemoryState()
        self.acquire = self._inner.acquire
        self.release = self._inner.release
        self.abandon = self._inner.abandon
        self.extend = self._inner.extend
        self.inspect = self._inner.inspect
        self.dedupe_add = self._inner.dedupe_add
        self.dedupe_keep = self._inner.dedupe_keep
        self.dedupe_forget = self._inner.dedupe_forget
        self.watch = self._inner.watch
        self.aclose = self._inner.aclose

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def pair_seconds(state: State, key_prefix: str, pairs: int) -> float:
    """Seconds per uncontended acquire+release by the calling task, over ``pairs`` pairs.

    A new :class:`AsyncLock` per pair on 16 rotating keys ``<key_prefix>pair-<n>``, as a
    request handler makes them: what the lock-scaling tests time.
    """
    t0 = time.perf_counter()
    for n in range(pairs):
        lock = AsyncLock(state, f"{key_prefix}pair-{n % 16}", ttl=60.0)
        await lock.acquire()
        await lock.release()
    return (time.perf_counter() - t0) / pairs
