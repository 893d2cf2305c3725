"""FairState: per-key lines of fair retries, honoured by ``fair_acquire``, bounded by holds.

Runs on the backends with the capability (memory, Redis, Redis Cluster); the SQL states refuse a
fair retry with an error naming the capability.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING

import pytest

from asynclock import AsyncLock, retry_on_lock_conflict, state_from_url
from asynclock.state import FairState
from tests._helpers import eventually
from tests._matrix import (
    BACKENDS,
    MEMORY,
    REDIS,
    REDIS_CLUSTER,
    Backend,
    purge_namespace,
    require,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import State

FAIR_BACKENDS = (MEMORY, REDIS, REDIS_CLUSTER)
FAIR_STATES = [pytest.param(b, id=b.name, marks=pytest.mark.redis) for b in FAIR_BACKENDS]
FAIR_STATES[0] = pytest.param(MEMORY, id=MEMORY.name, marks=pytest.mark.memory)
UNFAIR_STATES = [
    pytest.param(b, id=b.name, marks=getattr(pytest.mark, b.name))
    for b in BACKENDS
    if b not in FAIR_BACKENDS
]


@pytest.fixture(params=FAIR_STATES)
async def fair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[FairState, FairState]]:
    """Two clients of one fresh namespace (one object for memory), as two workers would have."""
    backend: Backend = request.param
    require(backend)
    namespace = uuid.uuid4().hex
    first = state_from_url(backend.url, **backend.options(namespace))
    second = state_from_url(backend.url, **backend.options(namespace)) if backend.server else first
    assert isinstance(first, FairState)
    assert isinstance(second, FairState)
    yield first, second
    await first.aclose()
    if second is not first:
        await second.aclose()
    await purge_namespace(backend, namespace)


async def test_turns_are_served_in_first_conflict_order(
    fair: tuple[FairState, FairState],
) -> None:
    one, two = fair
    assert (await one.fair_acquire("k", "h", 5.0, turn="H", hold=1.0)).token is not None
    a = await one.fair_acquire("k", "a1", 1.0, turn="A", hold=5.0)
    b = await two.fair_acquire("k", "b1", 1.0, turn="B", hold=5.0)
    assert a.token is None
    assert b.token is None
    assert a.retry_after is not None
    assert 4.0 < a.retry_after <= 5.0
    assert (await _state(one).release("k", "h")).owned
    # the key is free, but A met it busy first: B is refused, told how long A's place is kept
    b = await two.fair_acquire("k", "b2", 1.0, turn="B", hold=5.0)
    assert b.token is None
    assert b.retry_after is not None
    assert b.retry_after > 4.0
    a = await one.fair_acquire("k", "a2", 1.0, turn="A", hold=5.0)
    assert a.token is not None
    assert (await _state(one).release("k", "a2")).owned
    b = await two.fair_acquire("k", "b3", 1.0, turn="B", hold=5.0)
    assert b.token is not None
    assert b.token > a.token
    # served turns left the line: a newcomer is refused only by the lock itself
    assert (await _state(two).release("k", "b3")).owned
    assert (await one.fair_acquire("k", "c1", 1.0, turn="C", hold=5.0)).token is not None


async def test_a_vanished_turn_blocks_the_key_only_for_its_hold(
    fair: tuple[FairState, FairState],
) -> None:
    one, two = fair
    assert (await one.fair_acquire("k", "h", 0.05, turn="H", hold=1.0)).token is not None
    assert (await one.fair_acquire("k", "a1", 1.0, turn="A", hold=0.1)).token is None
    # A never comes back: its place is kept until 0.1 s after H's lock expired, then B gets it
    refused = await two.fair_acquire("k", "b1", 1.0, turn="B", hold=5.0)
    assert refused.token is None

    async def b_served() -> bool:
        grant = await two.fair_acquire("k", "b2", 1.0, turn="B", hold=5.0)
        return grant.token is not None

    await eventually(b_served, within=2.0)


async def test_a_turn_that_leaves_gives_way(fair: tuple[FairState, FairState]) -> None:
    one, two = fair
    assert (await one.fair_acquire("k", "h", 0.05, turn="H", hold=1.0)).token is not None
    assert (await one.fair_acquire("k", "a1", 1.0, turn="A", hold=30.0)).token is None
    await one.fair_leave("k", "A")

    async def b_served() -> bool:
        grant = await two.fair_acquire("k", "b1", 1.0, turn="B", hold=30.0)
        return grant.token is not None

    await eventually(b_served, within=2.0)


async def test_the_core_decorator_serves_fair_calls_in_conflict_order(
    fair: tuple[FairState, FairState],
) -> None:
    """Six calls meet a held lock 20 ms apart; once it is free they get it oldest first, though
    their jittered retries come back in another order."""
    one, two = fair
    order: list[int] = []

    @retry_on_lock_conflict(wait=0.05, jitter=1.0, attempts=200, fair=True)
    async def handle(n: int) -> None:
        async with AsyncLock(_state(one if n % 2 else two), "k", ttl=5.0, blocking=False):
            order.append(n)
            await asyncio.sleep(0.03)  # holds it while the others keep coming back

    holder = AsyncLock(_state(one), "k", ttl=5.0)
    await holder.acquire()
    calls = []
    for n in range(6):
        calls.append(asyncio.create_task(handle(n)))
        await asyncio.sleep(0.02)
    await holder.release()
    await asyncio.wait_for(asyncio.gather(*calls), 10.0)
    assert order == list(range(6))


@pytest.fixture(params=UNFAIR_STATES)
async def unfair_state(request: pytest.FixtureRequest) -> AsyncIterator[State]:
    backend: Backend = request.param
    require(backend)
    namespace = uuid.uuid4().hex
    opened = state_from_url(backend.url, **backend.options(namespace))
    yield opened
    await opened.aclose()
    await purge_namespace(backend, namespace)


async def test_a_state_without_fair_lines_refuses_a_fair_retry(unfair_state: State) -> None:
    @retry_on_lock_conflict(attempts=2, wait=0.01, fair=True)
    async def handle() -> None:
        async with AsyncLock(unfair_state, "k", blocking=False):
            pass

    with pytest.raises(NotImplementedError, match=r"FairState capability .* fair=False"):
        await handle()


def _state(fair_state: FairState) -> State:
    from asynclock import State

    assert isinstance(fair_state, State)
    return fair_state


async def test_a_call_that_gives_up_leaves_the_line_at_once(
    fair: tuple[FairState, FairState],
) -> None:
    """An exhausted fair call (dropped) must not keep its place for its hold: the next call,
    once the lock is free, gets it on its first try."""
    one, two = fair

    @retry_on_lock_conflict(wait=0.01, attempts=2, on_exhaustion="drop", fair=True, fair_window=30)
    async def gives_up() -> str:
        async with AsyncLock(_state(one), "k", ttl=5.0, blocking=False):
            return "ran"

    @retry_on_lock_conflict(attempts=1, fair=True, fair_window=30)
    async def newcomer() -> str:
        async with AsyncLock(_state(two), "k", ttl=5.0, blocking=False):
            return "ran"

    holder = AsyncLock(_state(one), "k", ttl=5.0)
    await holder.acquire()
    assert await gives_up() is None
    await holder.release()
    assert await newcomer() == "ran"
