"""Cheap one-shot timers for work that is nearly always cancelled before it is due.

A lock renewal and a claim-lease renewal are due ``ttl / 3`` after a lock is taken, and almost
every handler is done long before that: the timer is armed and cancelled once per event, and
fires only for slow handlers. ``loop.call_later`` + ``cancel`` costs a heap push, a timer
handle and (when the cancelled handles pile up) a heap rebuild every time; here arming and
cancelling is a dict insert and delete.

Timers of one event loop are kept in buckets by delay. Within a bucket every timer has the
same delay, so they fall due in the order they were armed: the bucket is an insertion-ordered
dict, and a single loop timer, armed for its oldest entry, fires the entries that are due and
re-arms itself for the next. An emptied bucket keeps its loop timer until it fires (and is then
dropped), so a key armed and cancelled in a tight loop schedules nothing new.

Invariants: a callback runs at most once, never before its due time, in the loop the timer was
armed in, and never after :meth:`Timer.cancel` returned.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Timer", "TimerEntry", "arm", "call_after", "call_later", "disarm", "first_renewal"]


def _disarmed() -> None:
    """What a cancelled timer would call (nothing: it is never called)."""


class TimerEntry(Protocol):
    """What a bucket keeps: where it is armed, when it is due, what to call. An object with
    these attributes (in its ``__slots__``) may be armed itself with :func:`arm`, sparing a
    :class:`Timer` per arming; :func:`disarm` cancels it."""

    _bucket: Bucket
    due: float
    callback: Callable[[], None]


def disarm(timer: TimerEntry) -> None:
    """Cancel ``timer`` (idempotent; a timer that fired already stays fired)."""
    timer._bucket.entries.pop(timer, None)
    # the callback is nearly always a bound method of the timer's owner, which refers to the
    # timer: a reference cycle per armed timer, left for the garbage collector
    timer.callback = _disarmed


class Timer:
    """One armed callback (see :func:`call_later`)."""

    __slots__ = ("_bucket", "callback", "due")
    _bucket: Bucket
    due: float
    callback: Callable[[], None]

    def cancel(self) -> None:
        """Disarm the timer (idempotent; a timer that fired already stays fired)."""
        disarm(self)


class Bucket:
    """The timers of one loop with one delay, oldest first, and the loop timer for the head."""

    __slots__ = ("_buckets", "_handle", "_loop", "delay", "entries")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, delay: float, buckets: dict[float, Bucket]
    ) -> None:
        self._loop = loop
        self.delay = delay
        self._buckets = buckets
        self.entries: dict[TimerEntry, None] = {}
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, timer: TimerEntry, callback: Callable[[], None]) -> None:
        timer._bucket = self
        timer.due = self._loop.time() + self.delay
        timer.callback = callback
        self.entries[timer] = None
        if self._handle is None:
            self._handle = self._loop.call_at(timer.due, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._loop.time()
        entries = self.entries
        while entries:
            timer = next(iter(entries))
            if timer.due > now:
                self._handle = self._loop.call_at(timer.due, self._fire)
                return
            del entries[timer]
            try:
                timer.callback()
            except Exception as exc:  # noqa: BLE001 - as a loop callback's error: reported, not fatal
                self._loop.call_exception_handler(
                    {"message": "asynclock timer callback failed", "exception": exc}
                )
        # nothing left: forget the bucket, so delays used once do not accumulate
        if self._buckets.get(self.delay) is self:
            del self._buckets[self.delay]


_buckets_by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Bucket]] = (
    weakref.WeakKeyDictionary()
)


#: the last loop's buckets, found without the weak dictionary's lookup; one tuple, read and
#: replaced at once, so threads (one loop each) never see half of it
_recent: tuple[weakref.ref[asyncio.AbstractEventLoop], dict[float, Bucket]] | None = None


def call_later(delay: float, callback: Callable[[], None]) -> Timer:
    """Run ``callback()`` in the running loop ``delay`` seconds from now, unless cancelled.

    Like ``loop.call_later``, but cheap to arm and cancel; meant for a few distinct delays
    (each delay has a bucket while any timer with it is armed).
    """
    timer = Timer()
    arm(timer, delay, callback)
    return timer


def call_after(started: float | None, delay: float, callback: Callable[[], None]) -> Timer | None:
    """Run ``callback()`` ``delay`` seconds after loop time ``started`` (``None``: now).

    At once, returning ``None``, if that time has passed already; else :func:`call_later`.
    ``None`` arms exactly ``delay``, so timers armed "from now" share one bucket.
    """
    if started is None:
        return call_later(delay, callback)
    left = started + delay - asyncio.get_running_loop().time()
    if left <= 0:
        callback()
        return None
    return call_later(left, callback)


def first_renewal(ttl: float, max_lifetime: float | None) -> float:
    """Seconds from taking a lock (or permit) of ``ttl`` to its first renewal, or to the end of
    its ``max_lifetime`` if that comes first."""
    return ttl / 3 if max_lifetime is None else min(ttl / 3, max_lifetime)


def arm(
    timer: TimerEntry,
    delay: float,
    callback: Callable[[], None],
    loop: asyncio.AbstractEventLoop | None = None,
) -> None:
    """:func:`call_later` with ``timer`` as the handle (an entry not armed at the moment);
    ``loop``: the running loop, when the caller has it at hand already."""
    global _recent
    if loop is None:
        loop = asyncio.get_running_loop()
    recent = _recent
    if recent is not None and recent[0]() is loop:
        buckets = recent[1]
    else:
        found = _buckets_by_loop.get(loop)
        if found is None:
            found = _buckets_by_loop[loop] = {}
        buckets = found
        _recent = (weakref.ref(loop), buckets)
    bucket = buckets.get(delay)
    if bucket is None:
        bucket = buckets[delay] = Bucket(loop, delay, buckets)
    bucket.arm(timer, callback)
