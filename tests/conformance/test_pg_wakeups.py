"""PostgresState's NOTIFY: sent for the releases a waiting state asked for, and only for those.

A NOTIFY holds one cluster-wide lock through its transaction's commit, so a release nobody waits
for sends none (docs/decisions.md, "PostgreSQL claims"). Notifications arrive in commit order:
once a later one has arrived, an earlier one would have too, so "none for that release" is
checked without waiting for a silence.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from asynclock import AsyncLock, state_from_url
from asynclock.state.sql._queries import key_id
from tests._helpers import SETTLE
from tests._matrix import POSTGRES, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.postgres

CHANNEL = "asynclock_released"  # the default table_prefix's release channel


class Heard:
    """The release notifications of this test's keys, in arrival order, as key names."""

    def __init__(self, prefix: str, keys: tuple[str, ...]) -> None:
        self.names = {key_id(f"{prefix}{key}").hex(): key for key in keys}
        self.keys: list[str] = []
        self.arrived = asyncio.Event()

    def __call__(self, conn: object, pid: object, channel: object, payload: object) -> None:
        key = self.names.get(str(payload))
        if key is not None:
            self.keys.append(key)
            self.arrived.set()

    async def next(self) -> None:
        await asyncio.wait_for(self.arrived.wait(), 10.0)
        self.arrived.clear()


@pytest.fixture
async def two_states() -> AsyncIterator[tuple[Any, Any, Heard]]:
    require(POSTGRES)
    namespace = uuid.uuid4().hex
    options = POSTGRES.options(namespace)
    holder = state_from_url(POSTGRES.url, **options)
    waiter = state_from_url(POSTGRES.url, **options)
    heard = Heard(str(options["prefix"]), ("quiet", "asked", "withdrawn"))
    listener = await asyncpg.connect(POSTGRES.url, timeout=10)
    await listener.add_listener(CHANNEL, heard)
    try:
        yield holder, waiter, heard
    finally:
        await listener.close()
        await holder.aclose()
        await waiter.aclose()
        await purge_namespace(POSTGRES, namespace)


async def test_only_a_flagged_release_notifies(two_states: tuple[Any, Any, Heard]) -> None:
    holder, waiter, heard = two_states
    assert (await holder.acquire("quiet", "h", 30.0)).token is not None
    assert (await holder.release("quiet", "h")).owned  # nobody asked: no NOTIFY
    assert (await holder.acquire("asked", "h", 30.0)).token is not None
    assert (await waiter.acquire("asked", "w", 30.0, waiting=True)).token is None  # flags it
    assert (await holder.release("asked", "h")).owned  # reserved for the waiter, NOTIFY
    await heard.next()
    assert heard.keys == ["asked"]
    assert (await waiter.acquire("asked", "w", 30.0, waiting=True)).token is not None


async def test_withdrawing_a_flag_notifies(two_states: tuple[Any, Any, Heard]) -> None:
    # the waiters of other states that saw the flag and did not flag the key themselves must
    # look again (and flag it) when the flag goes: its holder's release will not notify
    holder, waiter, heard = two_states
    assert (await holder.acquire("withdrawn", "h", 30.0)).token is not None
    assert (await waiter.acquire("withdrawn", "w", 30.0, waiting=True)).token is None
    await waiter.abandon("withdrawn", "w")
    await heard.next()
    assert heard.keys == ["withdrawn"]
    assert (await holder.release("withdrawn", "h")).owned  # unflagged again: no NOTIFY
    assert (await holder.acquire("asked", "h", 30.0)).token is not None
    assert (await waiter.acquire("asked", "w", 30.0, waiting=True)).token is None
    assert (await holder.release("asked", "h")).owned
    await heard.next()
    assert heard.keys == ["withdrawn", "asked"]


async def test_a_waiter_that_left_the_flag_to_another_is_woken_by_the_next_holder() -> None:
    # Y waits behind X's flag without a flag of its own. H's release (flagged by X) wakes both;
    # X takes the key, Y looks again and flags X's hold, so X's release notifies too: Y is
    # served at X's release, not at the end of X's 30 s TTL.
    require(POSTGRES)
    namespace = uuid.uuid4().hex
    options = POSTGRES.options(namespace)
    h, x, y = (state_from_url(POSTGRES.url, **options) for _ in range(3))
    got: dict[str, float] = {}
    released: dict[str, float] = {}

    async def waiter(name: str, state: Any, hold: float) -> None:
        async with AsyncLock(state, "k", ttl=30.0, timeout=20.0):
            got[name] = time.monotonic()
            await asyncio.sleep(hold)  # X keeps the key while Y flags it
            released[name] = time.monotonic()

    try:
        holder = AsyncLock(h, "k", ttl=30.0)
        await holder.acquire()
        first = asyncio.create_task(waiter("x", x, 0.3))
        await asyncio.sleep(SETTLE)  # X waits, and has flagged the key
        second = asyncio.create_task(waiter("y", y, 0.0))
        await asyncio.sleep(SETTLE)  # Y waits behind X's flag
        await holder.release()
        await asyncio.wait_for(asyncio.gather(first, second), 25.0)
        assert got["x"] < got["y"]
        assert got["y"] - released["x"] < 1.0, (got, released)
    finally:
        for state in (h, x, y):
            await state.aclose()
        await purge_namespace(POSTGRES, namespace)
