"""Every dispatch's outcome, counted, logged and passed to ``on_outcome``: no silent loss.

:class:`OutcomeLog` is where a dispatch (and an inbox entry drained by ``serve()``, an event
stored by ``accept()``) ends up: counted in ``EventDispatcher.stats``, reported to the metrics
sink with its duration, logged on the ``asynclock`` logger at its outcome's level with the
event's keys, and handed to the ``on_outcome`` hook, whose own errors are logged and swallowed.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

from asynclock import metrics as _metrics
from asynclock._events.event import Event, Outcome
from asynclock.metrics._active import active

logger = logging.getLogger("asynclock")

OutcomeHook = Callable[[Event, Outcome, "BaseException | None"], "object | Awaitable[object]"]

LEVELS = {
    Outcome.HANDLED: logging.INFO,
    Outcome.DUPLICATE: logging.INFO,
    Outcome.QUEUED: logging.INFO,
    Outcome.SKIPPED: logging.INFO,
    Outcome.FORCED: logging.WARNING,
    Outcome.DROPPED: logging.WARNING,
    Outcome.FAILED: logging.ERROR,
    Outcome.ACCEPTED: logging.INFO,
    Outcome.SUPERSEDED: logging.INFO,
}


class OutcomeLog:
    """The outcome counts of one dispatcher (``stats``) and its ``on_outcome`` hook."""

    __slots__ = ("hook", "stats")

    def __init__(self, hook: OutcomeHook | None) -> None:
        self.hook = hook
        self.stats: dict[Outcome, int] = dict.fromkeys(Outcome, 0)

    async def record(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Outcome:
        """Count and log ``outcome`` (:meth:`count`), then pass it to the ``on_outcome`` hook."""
        self.count(event, outcome, lock_key, error, started)
        hook = self.hook
        if hook is not None:
            try:
                result = hook(event, outcome, error)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("asynclock: the on_outcome hook failed")
        return outcome

    def count(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Outcome:
        """:meth:`record` but the ``on_outcome`` hook (all of it, without one): count and log."""
        self.stats[outcome] += 1
        if active.sink is not None and started is not None:
            duration = asyncio.get_running_loop().time() - started
            _metrics.report("dispatch_outcome", event.type, outcome.value, duration)
        level = LEVELS[outcome]
        if logger.isEnabledFor(level):  # the record's fields cost more than the rest of record()
            log(event, outcome, lock_key, level, error)
        return outcome


def log(
    event: Event, outcome: Outcome, lock_key: str, level: int, error: BaseException | None
) -> None:
    """Log ``event``'s ``outcome`` at ``level``, its keys as the record's fields."""
    logger.log(
        level,
        "asynclock: event %s %s/%s/%s message=%s -> %s%s",
        event.type,
        event.adapter,
        event.channel_id,
        event.thread_id,
        event.message_id,
        outcome.value,
        f" ({type(error).__name__}: {error})" if error is not None else "",
        exc_info=error if outcome is Outcome.FAILED else None,
        extra={
            "event_type": event.type,
            "adapter": event.adapter,
            "channel_id": event.channel_id,
            "thread_id": event.thread_id,
            "message_id": event.message_id,
            "dedupe_key": event.dedupe_key,
            "lock_key": lock_key,
            "outcome": outcome.value,
        },
    )
