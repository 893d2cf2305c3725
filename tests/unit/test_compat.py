"""The version shims of ``asynclock/_compat.py``."""

from __future__ import annotations

import asyncio

import pytest

from asynclock._compat import wait_set


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
