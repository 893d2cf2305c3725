"""What one webhook delivery ended with, and what its platform must be told (``deliver``).

:class:`Delivery` is the answer of :meth:`EventDispatcher.deliver`: the :class:`Outcome`
:meth:`~EventDispatcher.dispatch` would return, plus the two facts an endpoint needs to answer
truthfully: whether a ``DUPLICATE`` is only *in progress* (the first delivery's claim is still
leased, possibly by a worker that died), and how long the platform should wait before it
delivers again. :class:`DeliveryAnswers` works those two facts out after the dispatch: one read
of the dedupe record for a duplicate, a retry slot promised for a busy key.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asynclock._dedupe.claim import EventClaim
from asynclock._events.event import Event, Outcome
from asynclock._retry.slots import RetrySlots

if TYPE_CHECKING:
    from collections.abc import Callable

    from asynclock._dispatch.context import DispatchContext

# Enum members on the hot path as module constants (an enum descriptor lookup each otherwise)
_DUPLICATE, _DROPPED = Outcome.DUPLICATE, Outcome.DROPPED


@dataclass(frozen=True, slots=True)
class Delivery:
    """One delivery's outcome and what the platform should be told.

    Invariants: ``redeliver`` is ``True`` exactly for ``DROPPED``, ``FAILED`` and an in-progress
    ``DUPLICATE`` (the event is not handled yet, and nothing else will make it so); ``in_progress``
    is set only on a ``DUPLICATE``; ``retry_after`` is set only when ``redeliver`` is, and is
    ``None`` for ``FAILED`` (the platform's own back-off is as good a guess as any).

    Example:
        >>> from asynclock import Delivery, Outcome
        >>> Delivery(Outcome.HANDLED).redeliver
        False
        >>> busy = Delivery(Outcome.DUPLICATE, in_progress=True, retry_after=12.5)
        >>> busy.redeliver, busy.retry_after
        (True, 12.5)
    """

    outcome: Outcome
    #: a ``DUPLICATE`` whose first delivery is still being handled (its claim is leased, not
    #: done): not handled yet, and lost if the worker handling it died and nothing redelivers it
    in_progress: bool = False
    #: seconds after which the platform should deliver the event again: for ``DROPPED``, an
    #: estimate of when the key frees; for an in-progress ``DUPLICATE``, the lease's remaining time
    retry_after: float | None = None

    @property
    def redeliver(self) -> bool:
        """Whether the platform must deliver the event again (answer it with a non-2xx)."""
        return self.outcome in (Outcome.DROPPED, Outcome.FAILED) or self.in_progress


class DeliveryAnswers:
    """What ``deliver()`` tells the platform beyond the outcome, and every ``Retry-After``.

    Invariants: a retry is promised per busy key in this process's slot chain
    (:class:`~asynclock._dispatch.freeing.FreeingEstimate`), and, when a slot within the cap is
    free in the state (:class:`~asynclock._retry.slots.RetrySlots`), one no other worker
    promises; nothing here runs a handler or changes a lock.
    """

    __slots__ = ("context", "key_of", "slots")

    def __init__(self, context: DispatchContext, key_of: Callable[[Event], str]) -> None:
        self.context = context
        #: the event's lock key (``lock_scope``), asked only for the outcomes that need it
        self.key_of = key_of
        self.slots = RetrySlots(context.state)

    async def answer(self, event: Event, outcome: Outcome) -> Delivery:
        """The :class:`Delivery` of ``event``, dispatched with ``outcome``: an in-progress
        duplicate told from a done one, a retry promised when its key is busy."""
        context = self.context
        if outcome is _DROPPED:
            return Delivery(outcome, retry_after=await self.promise_retry(self.key_of(event)))
        reading = context.reading
        if outcome is not _DUPLICATE or reading is None:
            return Delivery(outcome)
        lock_key = self.key_of(event)
        claim = EventClaim.of(event, lock_key)
        if claim is None:  # not deduped: a DUPLICATE cannot come from a record
            return Delivery(outcome)
        remaining = await reading.dedupe_remaining(claim.key)
        if remaining is None:  # forgotten (not handled) or lapsed since: redeliver when it frees
            retry_after = await self.promise_retry(lock_key)
            return Delivery(outcome, in_progress=True, retry_after=retry_after)
        if remaining > context.lock_ttl:
            return Delivery(outcome)  # done: only a done record outlives a lease
        # just past the lapse, so the redelivery finds the claim gone; jittered, so the retries
        # of one burst do not land together
        return Delivery(outcome, in_progress=True, retry_after=remaining + jitter())

    def retry_after(self, lock_key: str) -> float:
        """When a retry on busy ``lock_key`` should come, by this process's estimate alone."""
        return self.context.freeing.retry_after(lock_key, cap=self.context.lock_ttl)

    async def promise_retry(self, lock_key: str) -> float:
        """When a retry on busy ``lock_key`` should come: this process's estimate, made a slot
        that no other worker promises (claimed in the state) when one is free within the cap."""
        estimate = self.retry_after(lock_key)
        claimed = await self.slots.claim(lock_key, estimate, cap=self.context.lock_ttl)
        if claimed is None:
            return estimate
        self.context.freeing.promised(lock_key, claimed)
        return claimed


def jitter() -> float:
    """Up to half a second, to spread retries that would otherwise land together."""
    return random.uniform(0.0, 0.5)
