"""``latest`` / ``debounce`` over the durable inbox: take what is pending, fold it, ack per call.

A drainer holding a key's lock takes the oldest pending entries as one batch
(:meth:`InboxState.inbox_take`), folds them as ``dispatch`` folds its backlog
(:func:`asynclock._events.folding.fold`: per thread and route, the newest handled, the older ones in
``ctx.skipped``) and runs the calls in the order of the events they handle. Invariants:

* An entry leaves the inbox only once the call that covered it (handled or skipped) returned,
  or failed its last attempt (then every entry of that call is dead-lettered): each call is
  acknowledged by its own fenced step, so a worker killed mid-batch leaves the unacknowledged
  entries pending, and the key's next drainer (once the lock's TTL ran out) takes them again,
  each with its attempt count one higher.
* A call that fails before its last attempt fails only its own entries: the other calls of the
  batch still run and are acknowledged; the failed entries stay pending and are folded into
  the next batch with what arrived since (so a newer event of their thread and route may then
  be the one handled, with them in ``ctx.skipped``). ``ctx.attempt`` of a call is the highest
  attempt count among its entries.
* ``retry_wait`` (``_inbox/retry.py``): once the batch's other calls ran, the entries of its
  failed calls wait in the state (``inbox_take(retry_in=...)``, the lock released in that
  step) for the longest wait their attempts ask; ``on_poison="park"``: a call that fails its
  last attempt dead-letters its entries and parks the key, and the batch stops there.
* ``debounce``: before each batch the drainer holds the key until no entry arrived for
  ``debounce`` seconds, but at most ``max(debounce, lock_ttl / 3)`` seconds (:func:`quiet_cap`),
  so a steady stream delays a key's batch by a bounded time and never starves it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from asynclock import metrics as _metrics
from asynclock._backoff import Backoff
from asynclock._compat import wait_set
from asynclock._events.codec import decode
from asynclock._events.event import HandlerContext, Outcome
from asynclock._events.folding import fold
from asynclock._events.handlers import call_all
from asynclock._inbox.drainer import PARKED
from asynclock._inbox.retry import RetryPlan
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from collections.abc import Callable

    from asynclock._events.event import Event, Recorder
    from asynclock._events.folding import BatchCall
    from asynclock._events.handlers import HandlerTable
    from asynclock._lock.acquisition import Acquisition
    from asynclock.state._protocol import InboxBatch, InboxEntry, InboxState

logger = logging.getLogger("asynclock")

#: entries one batch takes at most: a key with more pending folds them in several batches, each
#: of the oldest entries, so accept order is kept across batches
BATCH = 256


def quiet_cap(debounce: float, lock_ttl: float) -> float:
    """The longest a ``debounce`` drainer holds a key waiting for it to go quiet, in seconds."""
    return max(debounce, lock_ttl / 3)


class FoldingDrain:
    """How one ``serve()`` drains a key it holds under ``latest`` (``debounce=None``) or
    ``debounce`` (seconds without a new entry to wait for)."""

    __slots__ = (
        "_cap",
        "_debounce",
        "_handlers",
        "_inbox",
        "_max_attempts",
        "_observe",
        "_record",
        "_retry",
    )

    def __init__(
        self,
        inbox: InboxState,
        handlers: HandlerTable,
        *,
        debounce: float | None,
        lock_ttl: float,
        max_attempts: int,
        record: Recorder,
        observe: Callable[[str, float], None],
        retry: RetryPlan | None = None,
    ) -> None:
        self._inbox = inbox
        self._retry = retry if retry is not None else RetryPlan()
        self._handlers = handlers
        self._debounce = debounce
        self._cap = quiet_cap(debounce or 0.0, lock_ttl)
        self._max_attempts = max_attempts
        self._record = record
        self._observe = observe

    async def drain(self, key: str, lock: Acquisition, stopping: asyncio.Event) -> float | None:
        """Fold and handle ``key``'s entries until its inbox is empty (the lock released by the
        step that found it so) or ``stopping`` is set (the caller releases the lock).

        Returns the seconds the key waits for a retry in the state (the step that set the wait
        released the lock), else ``None``.
        """
        backoff = Backoff()
        while True:
            if self._debounce is not None and not await self._settle(key, lock, stopping):
                return None
            limit = 0 if stopping.is_set() else BATCH
            batch = await self._take(key, lock, limit=limit)
            if batch is None or not limit:
                return None
            released, failed, waits = await self._run(key, lock, batch)
            if released:
                return None
            if waits:
                # the failed calls' entries wait in the state, holding nothing (lock released)
                ids = tuple(i for ids, _ in waits for i in ids)
                retry_in = max(seconds for _, seconds in waits)
                await self._take(key, lock, limit=0, done=ids, retry_in=retry_in)
                return retry_in
            if failed:
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
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxBatch | None:
        if retry_in is None and not park:
            batch = await self._inbox.inbox_take(key, lock.owner, done=done, dead=dead, limit=limit)
        else:  # (only then: a custom state written before retry_in and park still works)
            batch = await self._inbox.inbox_take(
                key, lock.owner, done=done, dead=dead, limit=limit, retry_in=retry_in, park=park
            )
        if batch is None:
            lock.released_by_step()  # the step released it: the inbox was empty
        return batch

    async def _settle(self, key: str, lock: Acquisition, stopping: asyncio.Event) -> bool:
        """Hold ``key`` until no entry arrived for ``debounce`` seconds (at most the cap);
        ``False`` when the inbox turned out empty (the lock released)."""
        assert self._debounce is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._cap
        while True:
            batch = await self._take(key, lock, limit=0)
            if batch is None:
                return False
            wait = min(self._debounce - batch.quiet, deadline - loop.time())
            if wait <= 0 or stopping.is_set():
                return True
            await wait_set(stopping, wait)

    async def _run(
        self, key: str, lock: Acquisition, batch: InboxBatch
    ) -> tuple[bool, bool, list[tuple[tuple[int, ...], float]]]:
        """Run ``batch``'s calls in order, acknowledging each; ``(released, some call failed,
        the failed calls' entry ids and the seconds each asks to wait in the state)``."""
        events = [decode(entry.payload) for entry in batch.entries]
        failed = False
        waits: list[tuple[tuple[int, ...], float]] = []
        for call in fold(events, self._handlers):
            covered = [batch.entries[i] for i in (*call.skipped, call.handled)]
            attempt = max(entry.attempt for entry in covered)
            if active.sink is not None:
                _metrics.report("inbox_entry", key, batch.pending, covered[0].age)
            error = await self._call(key, lock, call, events, attempt)
            ids = tuple(entry.id for entry in covered)
            if error is None:
                left = await self._take(key, lock, limit=0, done=ids)
            elif attempt < self._max_attempts:
                failed = True  # its entries stay pending: the next batch has them again
                retry_in = self._retry.retry_in(key, attempt)
                if retry_in is not None:  # ... once they waited in the state (after the batch)
                    waits.append((ids, retry_in))
                continue
            else:
                text = self._dead(key, covered, events[call.handled], error)
                park = self._retry.park  # parked: the batch stops here, the rest stays pending
                left = await self._take(key, lock, limit=0, done=ids, dead=text, park=park)
            if left is None:
                return True, failed, []
        return False, failed, waits

    async def _call(
        self, key: str, lock: Acquisition, call: BatchCall, events: list[Event], attempt: int
    ) -> Exception | None:
        """Run one folded call and record its events' outcomes; the error it raised, if any."""
        event = events[call.handled]
        skipped = tuple(events[i] for i in call.skipped)
        ctx = HandlerContext(key, lock.token, skipped, attempt=attempt)
        began = asyncio.get_running_loop().time()
        try:
            await call_all(call.handlers, event, ctx)
        except Exception as error:  # noqa: BLE001 - a handler's failure is an outcome
            for failed in (*skipped, event):
                await self._record(failed, Outcome.FAILED, key, error)
            return error
        self._observe(key, asyncio.get_running_loop().time() - began)
        folded = Outcome.HANDLED if call.queued_all else Outcome.SKIPPED
        for older in skipped:
            await self._record(older, folded, key, None)
        await self._record(event, Outcome.HANDLED, key, None)
        return None

    def _dead(
        self,
        key: str,
        covered: list[InboxEntry],
        event: Event,
        error: Exception,
    ) -> str:
        """Log (and count) the dead-lettering of a call's entries; the error text they keep."""
        text = f"{type(error).__name__}: {error}"
        if active.sink is not None:
            for _ in covered:
                _metrics.report("inbox_dead_letter", key)
        logger.error(
            "asynclock: %d inbox entries of %r (handling %s) dead-lettered after %d attempts%s: %s",
            len(covered),
            key,
            event.message_id,
            self._max_attempts,
            PARKED if self._retry.park else "",
            text,
            extra={
                "lock_key": key,
                "message_id": event.message_id,
                "attempts": self._max_attempts,
                "event_type": event.type,
                "entries": [entry.id for entry in covered],
            },
        )
        return text
