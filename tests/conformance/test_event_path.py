"""The path of one event, module by module: which modules of the package run it (issue #25).

docs/architecture.md ("The path of one event, module by module") lists them; this holds the list
against what runs. One event is traced with :func:`sys.setprofile` after a warm-up event of the
same dispatcher (so one-time setup is left out): a fresh event on a free key, dispatched, and
one inbox entry from ``accept`` until its key's lock is released by the entry's removal.

Counted: every module of ``asynclock`` one of whose functions ran, once however often it ran,
with two rules. The state is one module (``asynclock.state``: whatever runs behind the
``State`` protocol, the backend with its transport, pool and guard), and the parts of floor 1 of
the architecture's drawing (``_errors``, ``_validate``, ``_owner``, ``_cancel``, ``_timers``,
``metrics``, ...; read from ``test_layout.floors``) are not counted: they are the vocabulary
every part shares, not places an event passes through.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import asynclock
from asynclock import Event, EventDispatcher
from tests._matrix import MEMORY, REDIS, Backend, _param, require
from tests.unit.test_layout import floors, part_graph, part_of

if TYPE_CHECKING:
    from types import FrameType

    from typing_extensions import Self

    from asynclock import State
    from asynclock._events.event import HandlerContext

ROOT = Path(asynclock.__file__).parent

#: what every path runs: the dispatcher (the entry point, the outcome), the claim, the engine (or
#: its line), the event, its handlers, the handling time for Retry-After, and the state
EVERY_PATH = {
    "_dispatch.dispatcher",
    "_dispatch.freeing",
    "_dedupe.claim",
    "_lock.engine",
    "_events.event",
    "_events.handlers",
    "state",
}
#: the modules each path runs, as counted above (keep docs/architecture.md in step)
PATHS: dict[str, set[str]] = {
    "dispatch-memory": EVERY_PATH | {"_dispatch.fast_route", "_dispatch.lean_hold"},
    "dispatch-redis": EVERY_PATH | {"_dispatch.general_route"},
    "inbox-redis": EVERY_PATH | {"_inbox.service", "_inbox.drainer", "_events.codec"},
}
PATHS["inbox-memory"] = PATHS["inbox-redis"]


@pytest.fixture(params=[_param(MEMORY), _param(REDIS)])
def backend(request: pytest.FixtureRequest) -> Backend:
    """Overrides conftest's: the paths the issue counts run on memory and on one Redis."""
    chosen: Backend = request.param
    require(chosen)
    return chosen


def vocabulary() -> set[str]:
    """The parts on floor 1 (``asynclock._timers``, ``asynclock.metrics``, ...)."""
    return {part for part, floor in floors(part_graph()).items() if floor == 1}


def counted(filename: str, leaves: set[str]) -> str | None:
    """The name ``filename`` counts under (see the module's docstring), ``None``: not counted."""
    try:
        relative = Path(filename).relative_to(ROOT)
    except ValueError:
        return None
    module = ".".join(("asynclock", *relative.with_suffix("").parts)).removesuffix(".__init__")
    if module.startswith("asynclock.state"):
        return "state"
    if part_of(module) in leaves:
        return None
    return module.removeprefix("asynclock.")


class Trace:
    """The modules whose functions run while it is entered (this thread: the event loop's)."""

    def __init__(self) -> None:
        self.leaves = vocabulary()
        self.files: set[str] = set()

    def __enter__(self) -> Self:
        self.previous = sys.getprofile()
        sys.setprofile(self.profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self.previous)

    def profile(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            self.files.add(frame.f_code.co_filename)

    def modules(self) -> set[str]:
        names = (counted(filename, self.leaves) for filename in self.files)
        return {name for name in names if name is not None}


def fresh(key: str) -> Event:
    return Event(
        type="message",
        adapter="path",
        channel_id=key,
        thread_id="t",
        message_id=f"m-{uuid.uuid4().hex}",
    )


async def test_one_dispatch(state: State, backend: Backend) -> None:
    bot = EventDispatcher(state=state)

    @bot.on("message")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        pass

    key = uuid.uuid4().hex
    await bot.dispatch(fresh(key))  # the warm-up: scripts loaded, connections open
    event = fresh(key)
    with Trace() as trace:
        outcome = await bot.dispatch(event)
    await bot.aclose()
    assert outcome is asynclock.Outcome.HANDLED
    ran = trace.modules()
    assert ran == PATHS[f"dispatch-{backend.name}"], sorted(ran)
    assert len([m for m in ran if m.startswith("_lock.")]) == 1  # the engine, uncontended


async def test_one_inbox_entry(state: State, backend: Backend) -> None:
    bot = EventDispatcher(state=state)
    handled: asyncio.Queue[Event] = asyncio.Queue()

    @bot.on("message")
    async def handle(event: Event, ctx: HandlerContext) -> None:
        handled.put_nowait(event)

    key = uuid.uuid4().hex

    async def one_entry() -> None:
        await bot.accept(fresh(key))
        await asyncio.wait_for(handled.get(), 10.0)
        # until the entry's removal released the key's lock (the state holds no event to wait on)
        while await state.inspect(f"path:{key}:t") is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)

    serving = asyncio.create_task(bot.serve())
    try:
        await one_entry()  # the warm-up: the worker's lanes, scripts, connections
        with Trace() as trace:
            await one_entry()
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        await bot.aclose()
    ran = trace.modules()
    assert ran == PATHS[f"inbox-{backend.name}"], sorted(ran)
    assert len([m for m in ran if m.startswith("_lock.")]) == 1
