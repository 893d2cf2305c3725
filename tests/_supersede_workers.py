"""Entry points of the OS processes that ``conformance/test_supersede_processes.py`` spawns.

Two processes share one state: the *holder* dispatches ``m1``, whose handler streams until it
is interrupted; the *newer* waits until the holder's handler runs (``inside``), then dispatches
``m2``. Each reports its outcome, its handler's context facts and wall-clock times (one machine:
``time.time()`` is comparable across the processes). Never raises: an ``"error"`` entry carries
the traceback to the parent.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from asynclock import Event, EventDispatcher, HandlerContext, state_from_url
from asynclock.state import SupersedeSignals
from tests.support.processes import report_back

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier
    from multiprocessing.synchronize import Event as EventFlag

BARRIER_TIMEOUT = 60.0


def supersede_worker(
    url: str,
    options: dict[str, object],
    role: str,
    grace: float | None,
    inside: EventFlag,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Run ``role`` (``"holder"`` or ``"newer"``) and put its report on ``results``."""
    report_back(results, _run(url, options, role, grace, inside, barrier))


async def _run(
    url: str,
    options: dict[str, object],
    role: str,
    grace: float | None,
    inside: EventFlag,
    barrier: Barrier,
) -> dict[str, Any]:
    state = state_from_url(url, **options)
    bot = EventDispatcher(state, on_lock_conflict="supersede", supersede_grace=grace)
    report: dict[str, Any] = {"pid": os.getpid(), "role": role, "signals": []}
    if isinstance(state, SupersedeSignals):
        # when each signal left this process: a late flag then tells a late first signal from
        # a lost one (a signal is sent again after every slice of the wait)
        signal = state.supersede

        async def timed_signal(key: str, token: int) -> None:
            report["signals"].append(time.time())
            await signal(key, token)

        state.supersede = timed_signal  # type: ignore[method-assign]

    @bot.on("message")
    async def stream(event: Event, ctx: HandlerContext) -> None:
        report["token"] = ctx.token
        report["skipped"] = [e.message_id for e in ctx.skipped]
        report["began"] = time.time()
        if role == "newer":
            return

        async def note_flag() -> None:
            await ctx.superseded.wait()
            report["flagged"] = time.time()

        watcher = asyncio.ensure_future(note_flag())
        inside.set()
        try:
            # a reply streamed in chunks, never looking at the flag; with grace None it is never
            # cancelled, and ends on its own half a second after the flag
            for _ in range(600):
                await asyncio.sleep(0.05)
                flagged = report.get("flagged")
                if grace is None and flagged is not None and time.time() - flagged > 0.5:
                    break
            report["ended"] = "returned"
        except asyncio.CancelledError:
            report["ended"] = "cancelled"
            raise
        finally:
            report["ended_at"] = time.time()
            await asyncio.sleep(0)  # the watcher notes a flag set in this very step
            watcher.cancel()

    try:
        await state.inspect("warm-up")  # connected before the start line
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)
        event = Event("message", "slack", "C1", "T1", "m1" if role == "holder" else "m2")
        if role == "newer":
            await asyncio.to_thread(inside.wait, BARRIER_TIMEOUT)
            report["sent"] = time.time()
        outcome = await asyncio.wait_for(bot.dispatch(event), 60.0)
        report["outcome"] = outcome.value
        await bot.aclose()
    finally:
        await state.aclose()
    return report


def serve_until_killed(
    url: str,
    options: dict[str, object],
    lock_ttl: float,
    phase: str,
    flags: tuple[EventFlag, EventFlag, EventFlag],
) -> None:
    """Serve the inbox under ``supersede`` (grace None) until the parent SIGKILLs the process.

    ``flags``: set when m1's call started, when it was flagged, when m2's call started.
    ``phase="interrupted"``: m1's handler streams on forever once flagged (the kill comes while
    it is interrupted, its entries unacknowledged). ``phase="covering"``: m1's handler returns
    once flagged; the call covering it (m2's) hangs (the kill comes mid-covering-call).
    """
    asyncio.run(_serve(url, options, lock_ttl, phase, flags))


async def _serve(
    url: str,
    options: dict[str, object],
    lock_ttl: float,
    phase: str,
    flags: tuple[EventFlag, EventFlag, EventFlag],
) -> None:
    started, flagged, covering = flags
    state = state_from_url(url, **options)
    bot = EventDispatcher(
        state, on_lock_conflict="supersede", supersede_grace=None, lock_ttl=lock_ttl
    )

    @bot.on("message")
    async def stream(event: Event, ctx: HandlerContext) -> None:
        if event.message_id == "m1":
            started.set()
            await ctx.superseded.wait()
            flagged.set()
            if phase == "covering":
                return
        else:
            covering.set()
        await asyncio.Event().wait()  # never returns: the parent kills the process

    await bot.serve()
