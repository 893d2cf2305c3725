"""The cheap timers behind lazy renewals, and the body canceller behind ``auto_renew``."""

from __future__ import annotations

import asyncio
import functools
import sys

import pytest

from asynclock import _timers
from asynclock._cancel import BodyCanceller
from asynclock._timers import call_later


async def test_timers_fire_once_in_due_order_and_not_early() -> None:
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    armed: dict[str, float] = {}

    def record(name: str) -> None:
        fired.append((name, loop.time()))

    for name, delay in (("a", 0.05), ("b", 0.02), ("c", 0.05), ("d", 0.03)):
        armed[name] = loop.time() + delay
        call_later(delay, functools.partial(record, name))
    await asyncio.sleep(0.15)
    assert [name for name, _ in fired] == ["b", "d", "a", "c"]
    for name, at in fired:
        assert at >= armed[name]


async def test_a_cancelled_timer_never_fires_and_cancel_is_idempotent() -> None:
    fired: list[str] = []
    first = call_later(0.02, lambda: fired.append("first"))
    call_later(0.02, lambda: fired.append("second"))
    first.cancel()
    first.cancel()
    await asyncio.sleep(0.06)
    assert fired == ["second"]


async def test_a_failing_callback_does_not_stop_the_others() -> None:
    loop = asyncio.get_running_loop()
    reported: list[BaseException] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context["exception"]))
    fired: list[str] = []

    def fail() -> None:
        raise ValueError("boom")

    try:
        call_later(0.01, fail)
        call_later(0.01, lambda: fired.append("after"))
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(None)
    assert fired == ["after"]
    assert [type(exc) for exc in reported] == [ValueError]


async def test_arming_and_cancelling_in_a_tight_loop_keeps_one_bucket() -> None:
    loop = asyncio.get_running_loop()
    for _ in range(10_000):
        call_later(7.5, lambda: None).cancel()
    buckets = _timers._buckets_by_loop[loop]
    assert list(buckets) == [7.5]
    assert buckets[7.5].entries == {}


async def test_an_emptied_bucket_is_dropped_when_its_loop_timer_fires() -> None:
    loop = asyncio.get_running_loop()
    call_later(0.013, lambda: None).cancel()
    assert 0.013 in _timers._buckets_by_loop[loop]
    await asyncio.sleep(0.05)
    assert 0.013 not in _timers._buckets_by_loop[loop]


async def test_the_body_canceller_swallows_only_its_own_cancellation() -> None:
    async def body(cancel_ours: bool) -> bool:
        canceller = BodyCanceller()
        try:
            if cancel_ours:
                canceller.cancel()
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            if not canceller.leave(asyncio.CancelledError):
                raise
            return True
        return False

    assert await asyncio.create_task(body(True)) is True
    outside = asyncio.create_task(body(False))
    await asyncio.sleep(0.01)
    outside.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outside


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is Python 3.11+")
async def test_a_cancellation_from_elsewhere_on_top_of_ours_still_propagates() -> None:
    async def body() -> None:
        canceller = BodyCanceller()
        try:
            canceller.cancel()
            asyncio.current_task().cancel()  # type: ignore[union-attr]  # and someone else
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            assert not canceller.leave(asyncio.CancelledError)
            raise

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(body())


async def test_the_body_canceller_cancels_nothing_once_left() -> None:
    canceller = BodyCanceller()
    assert canceller.leave(None) is False
    canceller.cancel()  # the block is over: no cancellation may reach what runs next
    await asyncio.sleep(0.01)
    task = asyncio.current_task()
    assert task is not None
    assert not task.cancelled()
