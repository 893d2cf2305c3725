"""The ``latest`` / ``debounce`` backlogs of ``dispatch()``: busy keys' events, drained in batches.

An event that finds its key busy under ``latest`` or ``debounce`` joins the key's backlog
(:class:`Backlog`) and waits for its outcome. One drainer task per
backlog takes the key's lock, (``debounce``: waits until no event arrived for ``debounce``
seconds,) folds the waiting events into handler calls (``_events/folding.py``: per thread and
route the newest is handled, the older ones skipped) and concludes each event's outcome. The
general route joins a backlog after its conflict policy said so; the fast route
(``fast_route.py``) joins one at once for a key busy in this loop.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from asynclock._events.event import HandlerContext, Outcome
from asynclock._events.folding import BatchCall, Waiting, conclude, fold, settle
from asynclock._events.handlers import call_all
from asynclock._lock.lock import AsyncLock

if TYPE_CHECKING:
    from asynclock._dedupe.claim import WaitingClaims
    from asynclock._dispatch.context import DispatchContext
    from asynclock._events.event import Event


class Backlog:
    """Events of one busy key waiting under ``latest``/``debounce`` in this process."""

    __slots__ = ("claims", "debounce", "drainer", "entries", "last_arrival")

    def __init__(self, debounce: bool) -> None:
        self.debounce = debounce
        self.entries: list[Waiting] = []
        self.drainer: asyncio.Task[object] | None = None
        self.last_arrival = 0.0
        #: the claims of the events that joined on MemoryState's lean path, until each has its
        #: outcome (made by the first of them)
        self.claims: WaitingClaims | None = None


class Backlogs:
    """This dispatcher's backlog per busy key, and their drainers.

    Invariants: a key has at most one backlog, registered from its first event until a drain
    round finds nobody waiting; a registered backlog always has a drainer running.
    """

    __slots__ = ("by_key", "context")

    def __init__(self, context: DispatchContext) -> None:
        self.context = context
        self.by_key: dict[str, Backlog] = {}

    async def join(self, event: Event, lock_key: str, *, debounce: bool) -> Outcome:
        """Wait in ``lock_key``'s backlog for ``event``'s outcome."""
        loop = asyncio.get_running_loop()
        return await self.entry(event, lock_key, debounce, loop)[1]

    def entry(
        self, event: Event, lock_key: str, debounce: bool, loop: asyncio.AbstractEventLoop
    ) -> tuple[Backlog, asyncio.Future[Outcome]]:
        """Append ``event`` to ``lock_key``'s backlog (starting its drainer if none runs): the
        backlog, and the future of the event's outcome."""
        backlog = self.by_key.get(lock_key)
        if backlog is None:
            backlog = self.by_key[lock_key] = Backlog(debounce)
        future: asyncio.Future[Outcome] = loop.create_future()
        backlog.entries.append((event, future))
        backlog.last_arrival = loop.time()
        if backlog.drainer is None:
            backlog.drainer = self.context.spawn(
                self.drain(lock_key, backlog), f"drain {lock_key!r}"
            )
        return backlog, future

    async def drain(self, lock_key: str, backlog: Backlog) -> None:
        """Serve a backlog: take the lock, handle each thread's newest event, the rest skipped.

        The backlog stays registered until a check that finds nobody waiting, and nothing is
        awaited between that check and unregistering it: an event that joins while a round ends
        (the lock being released) is served by the next round, never stranded.
        """
        context = self.context
        loop = asyncio.get_running_loop()
        batch: list[Waiting] = []
        calls: list[BatchCall] = []
        try:
            while any(not future.done() for _, future in backlog.entries):
                lock = AsyncLock(context.state, lock_key, context.lock_ttl, auto_renew=True)
                async with lock:
                    # debounce: hold the key until no new event arrived for `debounce` seconds
                    while (  # noqa: ASYNC110 - a timer that each new arrival pushes back
                        backlog.debounce
                        and (quiet := backlog.last_arrival + context.debounce - loop.time()) > 0
                    ):
                        await asyncio.sleep(quiet)
                    batch = [(e, f) for e, f in backlog.entries if not f.done()]
                    backlog.entries.clear()
                    calls = fold([event for event, _ in batch], context.handlers)
                    for call in calls:
                        if call.handlers:
                            event = batch[call.handled][0]
                            skipped = tuple(batch[i][0] for i in call.skipped)
                            ctx = HandlerContext(lock_key, lock.token, skipped)
                            try:
                                await call_all(call.handlers, event, ctx)
                            except Exception as error:  # noqa: BLE001 - its dispatches re-raise it
                                call.failure = error
                        call.ran = True
                # the lock is released before the batch's dispatches return, as for HANDLED
                conclude(batch, calls)
                batch, calls = [], []
        except BaseException as error:
            # the lock could not be had (state unavailable) or was lost while the batch was being
            # handled: the calls that ran keep their outcome; the rest of the batch and every
            # waiting event fail (and are forgotten)
            conclude(batch, [call for call in calls if call.ran])
            settle([*batch, *backlog.entries], error)
            backlog.entries.clear()
            if not isinstance(error, Exception):
                raise
        finally:
            if self.by_key.get(lock_key) is backlog:
                del self.by_key[lock_key]
