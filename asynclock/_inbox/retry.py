"""What the inbox's drainers do with a failed delivery: retry in the lock, wait in the state, or
set the entry aside (SPEC section 9: ``retry_wait``, ``on_poison``).

A retry that waits is kept in the state (``inbox_step(retry_in=...)`` / ``inbox_take``): the
entry stays at its key's head with its due time, the key's lock is released in the same step,
and nothing holds the key or a worker meanwhile. The worker that failed it sets a local timer
(:meth:`RetryPlan.timer_delay`) that takes the key again once it is due; if that worker is gone,
any live worker's rescan (``inbox_ready``, every few seconds) delivers it instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from asynclock._waits import wait_by_executions

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger("asynclock")

PoisonPolicy = Literal["dead_letter", "park"]
POISON_POLICIES: tuple[PoisonPolicy, ...] = ("dead_letter", "park")
#: a constant ``retry_wait``'s random part, as ``retry_on_lock_conflict``'s default jitter
JITTER = 0.15
#: waits shorter than this are retried in the lock (the servers keep milliseconds)
SHORTEST_WAIT = 0.001
#: how long after a retry is due its worker's timer takes the key (the state's clock and this
#: process's may disagree a little: a take that comes too early finds nothing)
TIMER_MARGIN = 0.1


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """One dispatcher's ``retry_wait`` (normalised) and ``on_poison``.

    Attributes:
        wait: ``attempt -> seconds`` a failed entry waits in the state before its next delivery
            (``attempt`` is the delivery that failed, 1 for the first); ``None``: every retry
            is the short in-lock backoff.
        park: after the last attempt, park the key (``on_poison="park"``) rather than let it go
            on past the dead letter.
    """

    wait: Callable[[int], float] | None = None
    park: bool = False

    def retry_in(self, key: str, attempt: int) -> float | None:
        """Seconds the entry of ``key`` whose delivery ``attempt`` failed waits in the state;
        ``None``: it is retried in the lock after the short backoff (no ``retry_wait``, a wait
        under a millisecond, or a ``retry_wait`` callable that failed, which is logged)."""
        if self.wait is None:
            return None
        try:
            seconds = self.wait(attempt)
        except Exception:
            # a broken retry_wait must not stop the key: its entry is retried as without it
            logger.exception(
                "asynclock: retry_wait(%d) failed for inbox %r; retrying in the lock",
                attempt,
                key,
                extra={"lock_key": key, "attempt": attempt},
            )
            return None
        return seconds if seconds >= SHORTEST_WAIT else None

    @staticmethod
    def timer_delay(retry_in: float) -> float:
        """When the failing worker's local timer takes the key again: just after it is due."""
        return retry_in + TIMER_MARGIN


def retry_plan(retry_wait: object, on_poison: object) -> RetryPlan:
    """Check and normalise ``EventDispatcher``'s ``retry_wait`` and ``on_poison``.

    ``retry_wait`` takes the forms of ``retry_on_lock_conflict``'s ``wait`` (one normalisation,
    :func:`asynclock._waits.wait_by_executions`): seconds (plus up to 15 % at random), or a
    callable ``attempt -> seconds``; ``None`` keeps the short in-lock backoff.

    Raises:
        TypeError: ``retry_wait`` is neither a number, a callable nor ``None``.
        ValueError: a negative or non-finite ``retry_wait``, ``"lock_ttl"`` (a failed delivery
            has no lock holder to wait for), or an unknown ``on_poison``.
    """
    if on_poison not in POISON_POLICIES:
        raise ValueError(f"on_poison must be 'dead_letter' or 'park', got {on_poison!r}")
    park = on_poison == "park"
    if retry_wait is None:
        return RetryPlan(None, park)
    if retry_wait == "lock_ttl":  # a form of retry_on_lock_conflict's wait, refused here
        raise ValueError(
            "retry_wait must be seconds or a callable attempt -> seconds, got 'lock_ttl' "
            "(it waits for a lock's holder; a failed delivery has none)"
        )
    wait, _ = wait_by_executions(
        retry_wait,  # type: ignore[arg-type]  # (checked there: a TypeError names it)
        JITTER,
        name="retry_wait",
        forms="a number of seconds or a callable attempt -> seconds",
    )
    return RetryPlan(wait, park)
