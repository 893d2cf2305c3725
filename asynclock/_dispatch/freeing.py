"""When a busy key frees: the per-process estimate behind every ``retry_after`` the dispatcher gives.

A platform told to retry after the lock's TTL retries far too late, and a burst of deliveries
told the same short delay retries all at once and collides again. :class:`FreeingEstimate`
keeps, per key, the average time this process saw a handling of that key take (every handling
it runs: a dispatch's handlers, an inbox entry's), and hands each retry it promises the next
*slot* after the ones it promised before on that key: the queue of retries ahead of it. Slots are
at least :data:`SLOT` apart (HTTP's ``Retry-After`` is whole seconds, so closer slots would land
in the same second), carry a random jitter (other processes promise slots of their own), and
never reach past the cap (the lock's TTL: a holder that dies frees the key by then); retries
beyond the last slot that fits are spread at random over the cap.

Invariants: memory is bounded (:data:`MAX_KEYS` keys, least recently used forgotten first);
nothing here awaits or touches the state.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict

#: the shortest spacing between two retries promised for one key (``Retry-After`` resolution)
SLOT = 1.0
#: the handling time assumed before any handling was seen (of the key, or of any key)
UNSEEN = 1.0
#: weight of the newest handling time in a key's moving average
ALPHA = 0.3
#: keys whose averages and promised slots are kept (the least recently used are forgotten)
MAX_KEYS = 4096


class FreeingEstimate:
    """Per key: the average handling time seen, and the last retry slot promised.

    Example:
        >>> estimate = FreeingEstimate()
        >>> estimate.observe("slack:C1:T1", 0.5)
        >>> first = estimate.retry_after("slack:C1:T1", cap=30.0)
        >>> second = estimate.retry_after("slack:C1:T1", cap=30.0)
        >>> 1.0 <= first < 1.5 and second >= first + 0.5
        True
    """

    __slots__ = ("_clock", "_handling", "_lapses", "_overall", "_slots")

    def __init__(self) -> None:
        self._handling: OrderedDict[str, float] = OrderedDict()
        self._slots: OrderedDict[str, float] = OrderedDict()
        #: per key, when the lock of a holder that stopped renewing it lapses (clock time)
        self._lapses: OrderedDict[str, float] = OrderedDict()
        self._overall: float | None = None
        self._clock = time.monotonic

    def observe(self, key: str, seconds: float) -> None:
        """A handling of ``key`` took ``seconds`` (this process ran it)."""
        # on every handled event: the blends inline, and a known key moved rather than re-added
        seconds = max(seconds, 0.0)
        handling = self._handling
        previous = handling.get(key)
        if previous is None:
            handling[key] = seconds
            if len(handling) > MAX_KEYS:
                _trim(handling)
        else:
            handling[key] = previous + ALPHA * (seconds - previous)
            handling.move_to_end(key)
        overall = self._overall
        self._overall = seconds if overall is None else overall + ALPHA * (seconds - overall)

    def stalled(self, key: str, lapses_in: float) -> None:
        """``key``'s holder stopped renewing its lock (dead or stuck): it lapses in ``lapses_in``.

        No retry promised for ``key`` comes before that: one that does finds the key still busy.
        """
        self._lapses.pop(key, None)
        self._lapses[key] = self._clock() + max(lapses_in, 0.0)
        _trim(self._lapses)

    def holder_left(self, key: str, left: float | None, ttl: float) -> None:
        """The busy ``key``'s holder has ``left`` seconds on its lock of ``ttl`` (``None``:
        unknown): a holder that stopped renewing it is :meth:`stalled`."""
        # a live holder renews every ttl/3, so it never has under 2/3 of it left for long:
        # less than half means it stopped (killed, stuck), and the key frees only at the lapse
        if left is not None and left < ttl / 2:
            self.stalled(key, left)

    def promised(self, key: str, after: float) -> None:
        """A retry on ``key`` was promised ``after`` seconds from now (a slot claimed elsewhere):
        the next promise comes a slot after it, if that is later than the chain says."""
        at = self._clock() + after
        if at > self._slots.get(key, at - 1.0):
            self._slots.pop(key, None)
            self._slots[key] = at
            _trim(self._slots)

    def handling(self, key: str) -> float:
        """The average handling time of ``key`` seen here (of any key, before one of ``key``)."""
        seen = self._handling.get(key)
        if seen is not None:
            return seen
        return UNSEEN if self._overall is None else self._overall

    def retry_after(self, key: str, *, cap: float) -> float:
        """Seconds after which a retry on busy ``key`` should come; promises it the next slot.

        The first retry promised for a key that is free of promises comes one handling time
        (at least :data:`SLOT`) from now, or when a stalled holder's lock lapses (:meth:`stalled`)
        if that is later; each further one a slot after the previous promise.
        Jitter (up to half a slot) spreads the retries of processes that promise alike. A slot
        past ``cap`` is not promised: more retries are queued than the cap lets us space out,
        so that one lands at random between one slot (or the stalled holder's lapse) and
        ``cap``.
        """
        now = self._clock()
        spacing = max(self.handling(key), SLOT)
        slot = max(self._slots.get(key, now), now) + spacing
        earliest = spacing
        lapse = self._lapses.get(key)
        if lapse is not None:
            if lapse > now:
                slot = max(slot, lapse)
                earliest = max(earliest, lapse - now)
            else:
                del self._lapses[key]
        if slot - now >= cap:  # the chain stays where it is: later promises land here too
            return random.uniform(min(earliest, cap), cap)
        self._slots.pop(key, None)
        self._slots[key] = slot
        _trim(self._slots)
        jitter = random.uniform(0.0, spacing / 2)
        return max(0.0, min(slot - now + jitter, cap))


def _trim(table: OrderedDict[str, float]) -> None:
    while len(table) > MAX_KEYS:
        table.popitem(last=False)
