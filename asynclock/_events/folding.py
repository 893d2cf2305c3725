"""latest/debounce: how a batch of one key's events is folded into handler calls.

Shared by the dispatcher's backlogs (``_dispatch/backlog.py``: the events waiting for a busy key
in this process, taken as one batch when the key frees) and the inbox's batches
(``_inbox/fold.py``): :func:`fold` splits a batch into handler calls so no skipped event goes
unseen, and :func:`conclude` gives each waiting dispatch its outcome once the lock is released.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock._events.event import Event, Outcome

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Sequence

    from asynclock._events.handlers import HandlerTable, Registered

#: an event of a latest/debounce backlog and the future its dispatch waits on
Waiting = tuple[Event, "asyncio.Future[Outcome]"]


class BatchCall:
    """One handler call of a latest/debounce batch (indexes into the batch)."""

    __slots__ = ("failure", "handled", "handlers", "queued_all", "ran", "skipped")

    def __init__(
        self,
        handled: int,
        skipped: list[int],
        handlers: list[Registered],
        *,
        queued_all: bool = False,
    ) -> None:
        self.handled = handled
        self.skipped = skipped
        self.handlers = handlers
        #: no handler takes any of these events: each ends QUEUED, none SKIPPED into nothing
        self.queued_all = queued_all
        self.ran = False
        self.failure: Exception | None = None


def conclude(batch: list[Waiting], calls: list[BatchCall]) -> None:
    """Give the dispatches of ``calls`` their outcomes (the handled QUEUED, the rest SKIPPED)."""
    for call in calls:
        entries = [batch[i] for i in (*call.skipped, call.handled)]
        if call.failure is not None:
            settle(entries, call.failure)
            continue
        for index in call.skipped:
            future = batch[index][1]
            if not future.done():
                future.set_result(Outcome.QUEUED if call.queued_all else Outcome.SKIPPED)
        if not batch[call.handled][1].done():
            batch[call.handled][1].set_result(Outcome.QUEUED)


def settle(entries: list[Waiting], error: BaseException) -> None:
    """Fail the dispatches still waiting on ``entries`` with ``error`` (cancel on a BaseException)."""
    for _, future in entries:
        if not future.done():
            if isinstance(error, Exception):
                future.set_exception(error)
            else:
                future.cancel()


def fold(batch: Sequence[Event], handlers: HandlerTable) -> list[BatchCall]:
    """Split a latest/debounce batch into handler calls, so no skipped event goes unseen.

    The same folding serves the in-process backlog of ``dispatch`` and the inbox entries
    ``serve`` takes as one batch; a call names its events by their index in ``batch``.

    An event's *route* is its own type when a handler is registered for that type, else
    ``"*"`` when a catch-all is, else none. Per thread and route, the newest event is handled
    and the older ones are in its call's ``ctx.skipped``: an event is only ever skipped
    into a call for its own thread, of its own type whenever that type has a handler. An
    event with no route joins the skipped of its thread's last call; a thread with no routed
    event at all gets one call without handlers (its events end ``QUEUED``, as a lone
    dispatch that no handler takes ends ``HANDLED``). Calls run in the order of the events
    they handle.
    """
    routed: dict[tuple[str, str], list[int]] = {}
    unrouted: dict[str, list[int]] = {}
    for index, event in enumerate(batch):
        route = handlers.route_of(event.type)
        if route is None:
            unrouted.setdefault(event.thread_key, []).append(index)
        else:
            routed.setdefault((event.thread_key, route), []).append(index)
    calls: list[BatchCall] = []
    last_of_thread: dict[str, BatchCall] = {}
    for (thread, _), indexes in sorted(routed.items(), key=lambda item: item[1][-1]):
        newest = indexes[-1]
        call = BatchCall(newest, indexes[:-1], handlers.for_type(batch[newest].type))
        calls.append(call)
        last_of_thread[thread] = call  # sorted by the newest index: the thread's last call
    for thread, indexes in unrouted.items():
        last = last_of_thread.get(thread)
        if last is None:
            calls.append(BatchCall(indexes[-1], indexes[:-1], [], queued_all=True))
        else:
            last.skipped = sorted([*last.skipped, *indexes])
    return calls
