"""The version shims of ``asynclock/_compat.py``."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

import pytest

from asynclock._cancel import kept_cancellation
from asynclock._compat import wait_set

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
async def test_a_cancellation_that_meets_the_event_being_set_is_never_lost(turns: int) -> None:
    # asyncio.wait_for before 3.12 returns the result when the cancel arrives after the event was
    # set but before the waiting task ran again: the task then runs on, cancelled in name only.
    event = asyncio.Event()
    task = asyncio.ensure_future(wait_set(event, 10.0))
    await asyncio.sleep(0)
    event.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    if task.cancel():  # the task had not ended: the cancellation must reach it
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        assert task.result() is True


async def test_wait_set_answers_whether_the_event_was_set() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    assert await wait_set(event, 0) is False
    event.set()
    assert await wait_set(event, 0) is True
    asyncio.get_running_loop().call_later(0.01, event.clear)
    assert await wait_set(event, 1.0) is True


async def _connect_like_aiomysql() -> str:
    # aiomysql opens its socket under asyncio.wait_for
    made = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(made.set_result, "connection")
    return await asyncio.wait_for(made, 10.0)


async def _outcomes(opening: Callable[[], Awaitable[str]]) -> set[str]:
    """What a cancellation sent after 0, 1, 2, ... loop turns makes of ``opening``."""
    outcomes = set()
    for turns in range(6):
        task = asyncio.ensure_future(opening())
        for _ in range(turns):
            await asyncio.sleep(0)
        if not task.cancel():
            outcomes.add("done before the cancellation")
            continue
        try:
            await task
        except asyncio.CancelledError:
            outcomes.add("cancelled")
        else:
            outcomes.add("cancellation lost")
    return outcomes


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 cannot tell a lost cancellation")
async def test_a_cancellation_a_driver_loses_in_its_connect_is_raised_again() -> None:
    if sys.version_info < (3, 12):  # the driver's shape loses one: else this test proves nothing
        assert "cancellation lost" in await _outcomes(_connect_like_aiomysql)
    closed: list[str] = []

    async def kept() -> str:
        return await kept_cancellation(_connect_like_aiomysql(), closed.append)

    outcomes = await _outcomes(kept)
    assert "cancellation lost" not in outcomes
    assert "cancelled" in outcomes
    if sys.version_info < (3, 12):
        assert closed  # each connection made as the cancellation came: closed, not handed on
        assert set(closed) == {"connection"}
