"""What one webhook delivery ended with, and what its platform must be told (``deliver``).

:class:`Delivery` is the answer of :meth:`EventDispatcher.deliver`: the :class:`Outcome`
:meth:`~EventDispatcher.dispatch` would return, plus the two facts an endpoint needs to answer
truthfully: whether a ``DUPLICATE`` is only *in progress* (the first delivery's claim is still
leased, possibly by a worker that died), and how long the platform should wait before it
delivers again.
"""

from __future__ import annotations

from dataclasses import dataclass

from asynclock._events.event import Outcome


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
