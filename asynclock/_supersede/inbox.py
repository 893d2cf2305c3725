"""``supersede`` over the durable inbox: a newer accept interrupts the key's running call.

A drainer holding a key's lock subscribes to the key's supersede signals
(:class:`~asynclock.state.SupersedeSignals`) before its first take, aimed at its fencing token,
then takes what is pending (:meth:`InboxState.inbox_take`) and handles the newest entry with
the others in ``ctx.skipped`` (accept order). An ``accept`` of the key signals the lock's
holder; the drainer, on a signal, checks that an entry beyond its batch is pending (the signal
of an entry already in the batch interrupts nothing), then interrupts the call as ``dispatch``
does (``ctx.superseded`` set, the task cancelled ``supersede_grace`` seconds later) and, once
the call ended, takes the key's entries again: the interrupted ones with the newer.

Invariants:

* An entry leaves the inbox only once the call that covered it returned (or failed its last
  attempt: then every entry of that call is dead-lettered). An interrupted call acknowledges
  nothing, so a worker killed anywhere leaves its entries pending, and the key's next drainer
  (once the lock's TTL ran out) takes them all again.
* Outcomes are recorded when the covering call returned: the newest ``HANDLED``, entries whose
  own call was interrupted ``SUPERSEDED`` (as far as this drainer saw), the others ``SKIPPED``.
* An interruption is a delivery: the entries' attempt counts (``ctx.attempt``) go up by one, as
  for a call that failed; but it is no failure: ``max_attempts`` counts the deliveries that
  failed, less the interruptions this drainer saw.
* The covering call runs under a higher fencing token than the interrupted one: the drainer
  releases the key and takes it again in between (see :meth:`SupersedingDrain.drain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from typing import TYPE_CHECKING

from asynclock._backoff import Backoff
from asynclock._errors import LockAcquisitionError
from asynclock._events.codec import decode
from asynclock._events.event import HandlerContext, Outcome
from asynclock._events.handlers import call_all
from asynclock._lock.acquisition import Acquisition
from asynclock._supersede.line import Running
from asynclock.state._protocol import SupersedeSignals

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from asynclock._events.event import Event, Recorder
    from asynclock._events.handlers import HandlerTable
    from asynclock.state._protocol import (
        InboxBatch,
        InboxEntry,
        InboxState,
        State,
        SupersedeWatch,
    )

__all__ = ["SupersedingDrain", "signal_holder"]

logger = logging.getLogger("asynclock")

#: entries one batch takes at most (the oldest: a key with more is covered by several calls)
BATCH = 256


async def signal_holder(state: State, key: str) -> None:
    """Tell the holder of ``key``'s lock, if any, that a newer event arrived (after an accept)."""
    if not isinstance(state, SupersedeSignals):
        return
    holder = await state.inspect(key)
    if holder is not None:
        await state.supersede(key, holder.token)


class Interrupted:
    """What one drain saw interrupted: entries handled by an interrupted call (``SUPERSEDED``
    once covered), and per entry the interrupted calls it was in (deliveries that were no
    failures, so they do not count toward ``max_attempts``; a worker that takes over after a
    crash does not know them, and counts them as deliveries)."""

    __slots__ = ("calls", "handled")

    def __init__(self) -> None:
        self.handled: set[int] = set()
        self.calls: Counter[int] = Counter()


class SupersedingDrain:
    """How one ``serve()`` drains a key it holds under ``supersede``."""

    __slots__ = ("_grace", "_handlers", "_inbox", "_max_attempts", "_observe", "_record", "_state")

    def __init__(
        self,
        state: State,
        inbox: InboxState,
        handlers: HandlerTable,
        *,
        grace: float | None,
        max_attempts: int,
        record: Recorder,
        observe: Callable[[str, float], None],
    ) -> None:
        self._state = state
        self._inbox = inbox
        self._handlers = handlers
        self._grace = grace
        self._max_attempts = max_attempts
        self._record = record
        self._observe = observe

    async def drain(self, key: str, lock: Acquisition, stopping: asyncio.Event) -> None:
        """Handle ``key``'s entries until its inbox is empty (the lock released by the step
        that found it so) or ``stopping`` is set (the caller releases the lock).

        After an interruption the key's lock is released and taken again at once, so the
        covering call runs under a higher fencing token than the interrupted one (a store that
        fences by token refuses the interrupted handler's late writes). If another worker took
        the key meanwhile, it covers the entries instead.
        """
        superseded = Interrupted()
        if await self._hold(key, lock, stopping, superseded) != "interrupted":
            return
        await lock.release()
        while True:
            again = Acquisition(self._state, key, lock.ttl, blocking=False, auto_renew=True)
            try:
                await again.enter()
            except LockAcquisitionError:
                return  # another worker holds the key: its drain covers the entries
            try:
                held = await self._hold(key, again, stopping, superseded)
            except BaseException as error:
                await again.exit(type(error), error)
                raise
            await again.exit(None, None)  # (nothing to release if a step did)
            if held != "interrupted":
                return

    async def _hold(
        self, key: str, lock: Acquisition, stopping: asyncio.Event, superseded: Interrupted
    ) -> str:
        """Drain under ``lock`` until the inbox is empty (``"released"``), ``stopping``
        (``"stopped"``) or a call is interrupted (``"interrupted"``)."""
        backoff = Backoff()
        async with _subscribed(self._state, key) as watch:
            if watch is not None:
                assert lock.token is not None
                watch.aim(lock.token)
            while True:
                limit = 0 if stopping.is_set() else BATCH
                batch = await self._take(key, lock, limit=limit)
                if batch is None:
                    return "released"
                if not limit:
                    return "stopped"
                outcome = await self._run(key, lock, batch, watch, superseded)
                if outcome in ("released", "interrupted"):
                    return outcome
                if outcome == "failed":
                    await backoff.failed()
                else:
                    backoff.succeeded()

    async def _take(
        self,
        key: str,
        lock: Acquisition,
        *,
        limit: int,
        done: tuple[int, ...] = (),
        dead: str | None = None,
    ) -> InboxBatch | None:
        batch = await self._inbox.inbox_take(key, lock.owner, done=done, dead=dead, limit=limit)
        if batch is None:
            lock.released_by_step()  # the step released it: the inbox was empty
        return batch

    async def _run(
        self,
        key: str,
        lock: Acquisition,
        batch: InboxBatch,
        watch: SupersedeWatch | None,
        superseded: Interrupted,
    ) -> str:
        """One call over ``batch``: ``"released"``, ``"failed"``, ``"interrupted"`` or ``"done"``."""
        entries = batch.entries
        events = [decode(entry.payload) for entry in entries]
        event, skipped = events[-1], tuple(events[:-1])
        attempt = max(entry.attempt for entry in entries)
        ctx = HandlerContext(key, lock.token, skipped, attempt=attempt)
        loop = asyncio.get_running_loop()
        began = loop.time()
        task = loop.create_task(call_all(self._handlers.for_type(event.type), event, ctx))
        running = Running(ctx, task, self._grace)
        listener = None
        if watch is not None:
            listener = loop.create_task(self._listen(key, lock, len(entries), watch, running))
        try:
            try:
                await asyncio.wait((task,))
            except asyncio.CancelledError:
                task.cancel()  # the lock lost, say: the call goes, its entries stay pending
                await asyncio.wait((task,))
                raise
        finally:
            running.ended()
            if listener is not None:
                listener.cancel()
                await asyncio.wait((listener,))
        ids = tuple(entry.id for entry in entries)
        if running.interrupted:
            superseded.handled.add(entries[-1].id)
            superseded.calls.update(ids)
            return "interrupted"  # nothing acknowledged: the next take has them with the newer
        error = None if task.cancelled() else task.exception()
        if task.cancelled():
            raise asyncio.CancelledError
        if isinstance(error, Exception):
            for failed in events:
                await self._record(failed, Outcome.FAILED, key, error)
            # interruptions seen here are no failures: they do not bring the dead letter nearer
            failures = max(entry.attempt - superseded.calls[entry.id] for entry in entries)
            if failures < self._max_attempts:
                return "failed"  # pending still: the next take has them again
            text = f"{type(error).__name__}: {error}"
            logger.error(
                "asynclock: %d inbox entries of %r (handling %s) dead-lettered after %d "
                "attempts: %s",
                len(entries),
                key,
                event.message_id,
                self._max_attempts,
                text,
                extra={"lock_key": key, "message_id": event.message_id},
            )
            left = await self._take(key, lock, limit=0, done=ids, dead=text)
            return "released" if left is None else "done"
        if error is not None:
            raise error
        self._observe(key, loop.time() - began)
        left = await self._take(key, lock, limit=0, done=ids)
        await self._conclude(key, entries, events, superseded)
        return "released" if left is None else "done"

    async def _conclude(
        self,
        key: str,
        entries: tuple[InboxEntry, ...],
        events: list[Event],
        superseded: Interrupted,
    ) -> None:
        """Record the outcomes of a call that returned (and was acknowledged)."""
        for entry, covered in zip(entries[:-1], events[:-1], strict=True):
            if entry.id in superseded.handled:
                superseded.handled.discard(entry.id)
                await self._record(covered, Outcome.SUPERSEDED, key, None)
            else:
                await self._record(covered, Outcome.SKIPPED, key, None)
        await self._record(events[-1], Outcome.HANDLED, key, None)

    async def _listen(
        self, key: str, lock: Acquisition, taken: int, watch: SupersedeWatch, running: Running
    ) -> None:
        """Interrupt ``running`` once a signal comes while an entry beyond its batch is pending."""
        while True:
            while not await watch.wait(3600.0):
                pass
            watch.reset()  # before the check: a signal after it wakes this loop again
            try:
                batch = await self._inbox.inbox_take(key, lock.owner, limit=0)
            except Exception as exc:  # noqa: BLE001 - the lock lost, the state down: the
                # drainer's own next step says so; the call is not interrupted on a guess
                logger.debug("asynclock: supersede check of %r failed: %r", key, exc)
                return
            if batch is not None and batch.pending > taken:
                running.interrupt()
                return


@contextlib.asynccontextmanager
async def _subscribed(state: State, key: str) -> AsyncIterator[SupersedeWatch | None]:
    if not isinstance(state, SupersedeSignals):
        yield None
        return
    async with state.supersede_watch(key) as watch:
        yield watch
