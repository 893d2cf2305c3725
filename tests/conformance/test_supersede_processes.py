"""``supersede`` across two OS processes sharing one server (SPEC section 10).

The holder's handler streams in another process; the newer event's process interrupts it through
the server's push (Redis pub/sub, PostgreSQL NOTIFY, MySQL's ear killed by KILL QUERY). The flag
must reach the holder well within the waiter's one-second wait slice, which a poll would not.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import uuid
from typing import TYPE_CHECKING

import pytest

from asynclock import Event, EventDispatcher, HandlerContext, Outcome
from tests import _supersede_workers
from tests._matrix import INBOX_SERVER_STATES, Backend, purge_namespace, require
from tests.conftest import Target
from tests.support.processes import run_processes

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.processes

#: seconds from the newer event's dispatch to the flag in the holder's process (loaded box)
PROMPT = 0.8


def ev(message_id: str) -> Event:
    return Event("message", "slack", "C1", "T1", message_id)


@pytest.fixture(params=INBOX_SERVER_STATES)
async def inbox_target(request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    backend: Backend = request.param
    require(backend)
    made = Target(backend, uuid.uuid4().hex)
    yield made
    await purge_namespace(backend, made.namespace)


@pytest.mark.parametrize("grace", [0.0, 0.3, None])
async def test_a_newer_event_interrupts_a_handler_in_another_process(
    server_target: Target, grace: float | None
) -> None:
    inside = multiprocessing.get_context("spawn").Event()
    roles = ("holder", "newer")
    reports = await run_processes(
        [
            (
                _supersede_workers.supersede_worker,
                (server_target.url, server_target.options, roles[n], grace, inside),
            )
            for n in range(2)
        ]
    )
    holder, newer = sorted(reports, key=lambda report: roles.index(report["role"]))
    assert holder["outcome"] == "superseded"
    assert newer["outcome"] == "queued"
    signals = [round(at - newer["sent"], 3) for at in newer["signals"]]
    flagged = holder["flagged"] - newer["sent"]
    assert flagged < PROMPT, f"flagged {flagged:.3f} s after the dispatch; signals at {signals}"
    if grace is None:
        assert holder["ended"] == "returned"  # never cancelled: it streamed to its end
    else:
        assert holder["ended"] == "cancelled"
        waited = holder["ended_at"] - holder["flagged"]
        assert grace - 0.02 <= waited < grace + PROMPT
    assert newer["began"] >= holder["ended_at"]  # the newer call starts once the older ended
    assert newer["token"] > holder["token"]
    assert newer["skipped"] == ["m1"]  # handed over by the interrupted process


@pytest.mark.parametrize("phase", ["interrupted", "covering"])
async def test_a_worker_killed_mid_call_loses_nothing(inbox_target: Target, phase: str) -> None:
    """kill -9 of the worker while its call is interrupted, or while the covering call runs:
    the next worker covers every entry (m2 handled, m1 in its ctx.skipped)."""
    lock_ttl = 2.0
    spawn = multiprocessing.get_context("spawn")
    started, flagged, covering = spawn.Event(), spawn.Event(), spawn.Event()
    worker = spawn.Process(
        target=_supersede_workers.serve_until_killed,
        args=(
            inbox_target.url,
            inbox_target.options,
            lock_ttl,
            phase,
            (started, flagged, covering),
        ),
        daemon=True,
    )
    web_state = inbox_target.open()
    web = EventDispatcher(web_state, on_lock_conflict="supersede", lock_ttl=lock_ttl)
    worker.start()
    try:
        assert await web.accept(ev("m1")) is Outcome.ACCEPTED
        assert await asyncio.to_thread(started.wait, 60.0)
        assert await web.accept(ev("m2")) is Outcome.ACCEPTED
        assert await asyncio.to_thread(flagged.wait, 60.0)
        if phase == "covering":
            assert await asyncio.to_thread(covering.wait, 60.0)
    finally:
        worker.kill()  # SIGKILL: no finally, no release
        await asyncio.to_thread(worker.join, 20.0)

    calls: list[tuple[str | None, list[str | None], int]] = []
    outcomes: list[tuple[str | None, Outcome]] = []
    done = asyncio.Event()
    state = inbox_target.open()
    rescuer = EventDispatcher(
        state,
        on_lock_conflict="supersede",
        lock_ttl=lock_ttl,
        on_outcome=lambda event, outcome, error: outcomes.append((event.message_id, outcome)),
    )

    @rescuer.on("message")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        calls.append((event.message_id, [e.message_id for e in ctx.skipped], ctx.attempt))
        done.set()

    serve = asyncio.ensure_future(rescuer.serve())
    try:
        await asyncio.wait_for(done.wait(), 30.0)  # once the dead worker's lock ran out
        await asyncio.sleep(0.2)  # nothing more comes
    finally:
        await rescuer.aclose()
        await serve
        await state.aclose()
        await web_state.aclose()
    assert len(calls) == 1
    handled, skipped, attempt = calls[0]
    assert (handled, skipped) == ("m2", ["m1"])
    # the dead worker's deliveries counted: m1's (interrupted), then m1's and m2's (covering)
    assert attempt == (2 if phase == "interrupted" else 3)
    assert sorted(outcomes) == [("m1", Outcome.SKIPPED), ("m2", Outcome.HANDLED)]
