"""Metrics hooks: lock wait and hold times, conflicts, renewals, losses, dispatcher outcomes.

asynclock reports to at most one *sink*, set with :func:`set_metrics`. A sink is any object
with the methods of :class:`MetricsSink` (structural typing: no base class needed). Calls are
synchronous and made on the event loop, so a sink must be cheap and must not block; the ready
adapters (:mod:`asynclock.metrics.prometheus`, :mod:`asynclock.metrics.otel`) only update
in-memory instruments. A sink that raises is logged and ignored, never breaking a lock.

Lock keys are usually one per conversation or contact: unbounded. The adapters therefore never
use the key itself as a label, only ``key_label(key)`` (by default the part before the first
``":"``, e.g. ``"ig"`` for ``"ig:contact:42"``).

Example:
    >>> import asyncio, asynclock
    >>> from asynclock.metrics import set_metrics
    >>> class Printer:
    ...     def lock_acquired(self, key, wait, contended): print("acquired", key)
    ...     def lock_released(self, key, held): print("released", key)
    ...     def lock_conflict(self, key): pass
    ...     def lock_renewed(self, key): pass
    ...     def lock_lost(self, key, reason): pass
    ...     def dispatch_outcome(self, event_type, outcome, duration): pass
    >>> previous = set_metrics(Printer())
    >>> async def main():
    ...     async with asynclock.AsyncLock(asynclock.MemoryState(), "ig:contact:42"):
    ...         pass
    >>> asyncio.run(main())
    acquired ig:contact:42
    released ig:contact:42
    >>> _ = set_metrics(previous)
"""

from __future__ import annotations

import logging
from typing import Protocol, cast, runtime_checkable

# (aliased: the holder is no public attribute of this public module)
from asynclock.metrics._active import active as _current

__all__ = ("InboxMetricsSink", "MetricsSink", "default_key_label", "get_metrics", "set_metrics")

logger = logging.getLogger("asynclock")


@runtime_checkable
class MetricsSink(Protocol):
    """What asynclock reports. Every duration is in seconds."""

    def lock_acquired(self, key: str, wait: float, contended: bool) -> None:
        """A lock was acquired after ``wait`` seconds; ``contended``: it had to wait or retry."""

    def lock_released(self, key: str, held: float) -> None:
        """A lock was released (or handed over) after being held ``held`` seconds."""

    def lock_conflict(self, key: str) -> None:
        """An acquire gave up: the key was held (non-blocking, or its timeout ran out)."""

    def lock_renewed(self, key: str) -> None:
        """``auto_renew`` extended a held lock."""

    def lock_lost(self, key: str, reason: str) -> None:
        """A held lock was lost (renewal found it gone, or ``max_lifetime`` passed)."""

    def dispatch_outcome(self, event_type: str, outcome: str, duration: float) -> None:
        """``EventDispatcher.dispatch`` ended with ``outcome`` after ``duration`` seconds."""


@runtime_checkable
class InboxMetricsSink(Protocol):
    """Optional methods of a sink, for the durable inbox (a sink without them still works).

    Added in 0.1 with the inbox: :func:`report` skips a sink that lacks them.
    """

    def inbox_entry(self, key: str, pending: int, age: float) -> None:
        """A worker took an entry of ``key``'s inbox: ``pending`` entries there (this one
        included), the entry accepted ``age`` seconds ago (the inbox's lag: it is the oldest)."""

    def inbox_dead_letter(self, key: str) -> None:
        """An entry of ``key``'s inbox was dead-lettered after its last attempt."""


def set_metrics(sink: MetricsSink | None) -> MetricsSink | None:
    """Report to ``sink`` from now on (``None``: report nothing); returns the previous sink."""
    if sink is not None and not isinstance(sink, MetricsSink):
        raise TypeError(
            f"a metrics sink needs the methods of asynclock.metrics.MetricsSink, got {sink!r}"
        )
    previous, _current.sink = _current.sink, sink
    return cast("MetricsSink | None", previous)


def get_metrics() -> MetricsSink | None:
    """The sink asynclock reports to, or ``None``."""
    return cast("MetricsSink | None", _current.sink)


def default_key_label(key: str) -> str:
    """The label an adapter uses for ``key``: the part before the first ``":"``."""
    return key.split(":", 1)[0]


def report(method: str, *args: object) -> None:
    """Call ``method`` on the sink, if any; a failing sink is logged, never raised."""
    sink = _current.sink
    if sink is None:
        return
    call = getattr(sink, method, None)
    if call is None:  # an optional method (InboxMetricsSink) the sink does not have
        return
    try:
        call(*args)
    except Exception:
        logger.exception("asynclock: the metrics sink failed in %s", method)
