"""Entry points of the OS processes that ``conformance/test_dispatcher_processes.py`` spawns.

Each process builds its own state from the URL, its own :class:`EventDispatcher`, and dispatches
its own shuffled stream of events all at once. It reports every handler call as an interval
``(start, end, lock_key, message_id, token, pid)`` and every dispatch's outcome. Never raises: an
``"error"`` entry carries the traceback to the parent.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import TYPE_CHECKING, Any

from asynclock import Event, EventDispatcher, HandlerContext, state_from_url
from tests._workers import redis_client
from tests.support.processes import report_back, spawned

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier
    from multiprocessing.synchronize import Event as EventFlag

    from asynclock._dispatch.policies import PolicyName

BARRIER_TIMEOUT = 60.0

#: (thread_id, message_id): what the parent sends; a process turns each into an Event
Spec = tuple[str, str]


def event_of(spec: Spec) -> Event:
    thread_id, message_id = spec
    return Event(
        type="message",
        adapter="slack",
        channel_id="C1",
        thread_id=thread_id,
        message_id=message_id,
        raw={"event_id": message_id},
    )


def dispatch_worker(
    url: str,
    options: dict[str, object],
    stream: list[Spec],
    policy: PolicyName,
    counter_prefix: str | None,
    seed: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Dispatch ``stream`` (shuffled with ``seed``) concurrently; report intervals and outcomes.

    With ``counter_prefix`` (Redis), each handler INCRs ``<prefix><lock key>`` on the server on
    entry and DECRs it on exit; ``most_inside`` is the largest value any handler saw.
    """
    report_back(results, _dispatch_all(url, options, stream, policy, counter_prefix, seed, barrier))


async def _dispatch_all(
    url: str,
    options: dict[str, object],
    stream: list[Spec],
    policy: PolicyName,
    counter_prefix: str | None,
    seed: int,
    barrier: Barrier,
) -> dict[str, Any]:
    order = list(stream)
    random.Random(seed).shuffle(order)
    intervals: list[tuple[float, float, str, str | None, int | None, int]] = []
    most_inside = 0
    counter: Any = None
    prefix = counter_prefix or ""
    if counter_prefix is not None:
        counter = redis_client(url)
    state = state_from_url(url, **options)
    bot = EventDispatcher(state, on_lock_conflict=policy, lock_ttl=10.0, raise_errors=False)

    @bot.on("message")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        nonlocal most_inside
        start = time.time()
        if counter is not None:
            most_inside = max(most_inside, int(await counter.incr(prefix + ctx.lock_key)))
        await asyncio.sleep(0.002)
        if counter is not None:
            await counter.decr(prefix + ctx.lock_key)
        intervals.append(
            (start, time.time(), ctx.lock_key, event.message_id, ctx.token, os.getpid())
        )

    try:
        await state.inspect("warm-up")  # connected before the start line
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)
        outcomes = await asyncio.gather(*(bot.dispatch(event_of(spec)) for spec in order))
        await bot.aclose()
    finally:
        await state.aclose()
        if counter is not None:
            await counter.aclose()
    return {
        "intervals": intervals,
        "outcomes": [
            (spec[1], outcome.value) for spec, outcome in zip(order, outcomes, strict=True)
        ],
        "most_inside": most_inside,
        "pid": os.getpid(),
    }


def dispatch_until_killed(
    url: str, options: dict[str, object], spec: Spec, lock_ttl: float, inside: EventFlag
) -> None:
    """Dispatch one event whose handler sets ``inside`` and then never returns.

    The parent SIGKILLs this process while the handler runs: the lock and the event's claim
    are left to their TTLs, with nobody to release or forget them.
    """
    asyncio.run(_hang_in_handler(url, options, spec, lock_ttl, inside))


async def _hang_in_handler(
    url: str, options: dict[str, object], spec: Spec, lock_ttl: float, inside: EventFlag
) -> None:
    state = state_from_url(url, **options)
    bot = EventDispatcher(state, lock_ttl=lock_ttl, dedupe_ttl=600.0)

    @bot.on("message")
    async def hang(event: Event) -> None:
        inside.set()
        await asyncio.Event().wait()

    await bot.dispatch(event_of(spec))


async def kill_mid_dispatch(
    url: str, options: dict[str, object], spec: Spec, lock_ttl: float, spawn_bound: float
) -> float:
    """Spawn :func:`dispatch_until_killed` for ``spec``, SIGKILL it once its handler runs.

    Returns when the process is gone, with the ``time.monotonic()`` of the kill: its lock and
    the event's claim lease stay behind until ``lock_ttl`` lapses.
    """
    import multiprocessing

    inside = multiprocessing.get_context("spawn").Event()
    async with spawned(dispatch_until_killed, url, options, spec, lock_ttl, inside) as proc:
        assert await asyncio.to_thread(inside.wait, spawn_bound), "never got inside"
        proc.kill()
        await asyncio.to_thread(proc.join, 10.0)
        return time.monotonic()
