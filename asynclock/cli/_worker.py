"""``asynclock worker MODULE:ATTR`` and ``asynclock inbox``: run and inspect the durable inbox.

``worker`` imports the dispatcher the way uvicorn imports an app (the current folder first on
the import path), runs its ``serve()`` until SIGTERM or SIGINT, then closes it: each key it was
draining finishes the entry in hand and releases its lock, and the process exits 0.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import signal
import sys
from typing import TYPE_CHECKING

from asynclock._dispatch.dispatcher import EventDispatcher
from asynclock._inbox.drainer import MAX_KEYS
from asynclock.cli._admin import open_state
from asynclock.state._protocol import InboxState

if TYPE_CHECKING:
    from asynclock.state._protocol import InboxKey


def load(target: str) -> object:
    """The object ``MODULE:ATTR`` names (the current folder is searched first, as uvicorn does)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"expected MODULE:ATTR (e.g. examples.fastapi_bot:bot), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    found: object = module
    missing = object()
    for part in attr.split("."):
        found = getattr(found, part, missing)
        if found is missing:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}")
    return found


async def dispatcher_of(target: str) -> EventDispatcher:
    """The dispatcher at ``target``: an ``EventDispatcher``, or a function returning one."""
    found = load(target)
    if not isinstance(found, EventDispatcher) and callable(found):
        found = found()
        if inspect.isawaitable(found):
            found = await found
    if not isinstance(found, EventDispatcher):
        raise TypeError(f"{target} is not an EventDispatcher (got {type(found).__name__})")
    return found


async def run_worker(target: str, *, max_keys: int = MAX_KEYS) -> int:
    """Serve the dispatcher at ``target`` (``max_keys`` at once) until SIGTERM/SIGINT, then close
    it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    # before the user's module loads (it may take a while): a SIGTERM then still ends the worker
    # cleanly, with nothing in hand
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    bot = await dispatcher_of(target)
    serving = asyncio.ensure_future(bot.serve(max_keys=max_keys))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        await bot.aclose()  # serve() finishes the entries in hand and returns
        await serving
        await bot.state.aclose()
    return 0


def format_inbox(keys: list[InboxKey]) -> str:
    """The ``asynclock inbox`` table: per key its pending events, oldest age, dead letters, and
    whether it waits for a retry ("retrying in 12s") or is parked."""
    if not keys:
        return "no pending events and no dead letters\n"
    width = max(len("key"), *(len(k.key) for k in keys))
    lines = [f"{'key':<{width}}  pending  oldest (s)  dead letters  state"]
    lines += [
        f"{k.key:<{width}}  {k.pending:>7}  {k.oldest_age:>10.1f}  {k.dead:>12}  {_state_of(k)}".rstrip()
        for k in keys
    ]
    return "\n".join(lines) + "\n"


def _state_of(key: InboxKey) -> str:
    """ "parked", "retrying in Ns" (due now: "retry due"), or "" (read with getattr: a custom
    state's keys may have the four fields of before)."""
    if getattr(key, "parked", False):
        return "parked"
    retry_in: float | None = getattr(key, "retry_in", None)
    if retry_in is None:
        return ""
    return f"retrying in {retry_in:.0f}s" if retry_in >= 0.5 else "retry due"


async def inbox_command(
    url: str, prefix: str | None, action: str | None = None, key: str | None = None
) -> str:
    """``asynclock inbox`` (list), ``inbox requeue KEY`` or ``inbox discard KEY``: the text to
    print."""
    async with open_state(url, prefix) as state:
        if not isinstance(state, InboxState):
            raise NotImplementedError(f"{type(state).__name__} has no durable inbox")
        if action == "requeue" and key is not None:
            moved = await state.inbox_requeue(key)
            return f"requeued {moved} dead letter(s) of {key!r}\n"
        if action == "discard" and key is not None:
            deleted = await state.inbox_discard(key)
            return f"discarded {deleted} dead letter(s) of {key!r}\n"
        return format_inbox(await state.inbox_keys())


async def dead_letter_count(url: str, prefix: str | None, key: str) -> int:
    """How many dead letters ``key`` has (what ``inbox discard KEY`` asks about first)."""
    async with open_state(url, prefix) as state:
        if not isinstance(state, InboxState):
            raise NotImplementedError(f"{type(state).__name__} has no durable inbox")
        return len(await state.inbox_dead_letters(key))
