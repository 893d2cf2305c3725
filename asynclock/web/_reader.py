"""One read of the state per refresh interval, shared by every viewer, and the history it feeds.

Every open page polls; ten tabs must not cost the state ten reads. :class:`Reader` keeps the
last snapshot and hands it to every request younger than ``max_age`` seconds; requests that
arrive while a read is running wait for that read (one flight). Each new snapshot appends one
sample to the :class:`History` (depth and lag over the last minutes, in this process's memory:
it starts empty, and a gap while nobody watched stays a gap).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asynclock.state._protocol import InboxState
from asynclock.web._snapshot import dead_rows, read_snapshot

if TYPE_CHECKING:
    from asynclock.state import State
    from asynclock.web._snapshot import DeadRow, Snapshot

__all__ = ("History", "Reader", "Reading", "Sample")

logger = logging.getLogger("asynclock")

#: dead letters remembered as first seen (for states that do not record when they died)
_SEEN_LIMIT = 10_000
#: a read of the state is reused for at least this many times as long as it took: whatever the
#: number of open pages, the dashboard keeps a state busy at most a fifth of the time (a Redis
#: inbox_keys() of 1,000 keys takes about a second: docs/benchmarks.md, "dashboard")
LOAD_BUDGET = 5.0


@dataclass(frozen=True, slots=True)
class Sample:
    """The inbox at one moment: the history's unit."""

    at: float
    #: events pending over every key (the deployment's depth)
    pending: int
    #: the oldest pending event's age, in seconds (the deployment's lag)
    lag: float
    keys: int
    dead: int
    locks: int


class History:
    """Samples of the last ``window`` seconds, oldest first."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._samples: collections.deque[Sample] = collections.deque()

    def add(self, snapshot: Snapshot) -> None:
        """Append the sample of ``snapshot``; forget those older than the window."""
        work = snapshot.work
        self._samples.append(
            Sample(
                at=snapshot.at,
                pending=sum(row.pending for row in work),
                lag=max((row.oldest_age for row in work), default=0.0),
                keys=len(work),
                dead=sum(row.dead for row in snapshot.keys),
                locks=len(snapshot.locks),
            )
        )
        while self._samples and self._samples[0].at < snapshot.at - self.window:
            self._samples.popleft()

    def samples(self) -> tuple[Sample, ...]:
        """The samples kept, oldest first."""
        return tuple(self._samples)


@dataclass(frozen=True, slots=True)
class Reading:
    """What a refresh shows: the last good snapshot (if any) and the last read's error."""

    snapshot: Snapshot | None
    #: why the last read failed (``None``: it did not); the snapshot is then the one before
    error: str | None
    #: UNIX time of that failure
    error_at: float | None
    #: seconds between two reads of the state now: the refresh's, or longer when reads are slow
    interval: float


class Reader:
    """The state's reads for one dashboard (see the module).

    Invariants: at most one snapshot read runs at a time; a snapshot is reused for ``max_age``
    seconds, or :data:`LOAD_BUDGET` times as long as its read took if that is longer; a failed read keeps the last good snapshot and says why (it is retried at the next
    refresh, never in a loop); a key's dead letters are read at most once per snapshot.
    """

    def __init__(self, state: State, *, max_age: float, history: History) -> None:
        self.state = state
        self.history = history
        self._max_age = max_age
        self._last: Snapshot | None = None
        self._read_at = float("-inf")  # monotonic time of the last read, good or failed
        self._error: str | None = None
        self._error_at: float | None = None
        self._flight: asyncio.Future[None] | None = None
        self._dead: dict[str, list[DeadRow]] = {}
        self._seen: collections.OrderedDict[tuple[str, int], float] = collections.OrderedDict()

    def invalidate(self) -> None:
        """Read anew at the next request (an action changed the state)."""
        self._read_at = float("-inf")

    def interval(self) -> float:
        """Seconds a read is reused for now (see the class)."""
        took = self._last.took if self._last is not None else 0.0
        return max(self._max_age, LOAD_BUDGET * took)

    async def reading(self) -> Reading:
        """The current reading: a fresh one if the last is older than :meth:`interval`."""
        if time.monotonic() - self._read_at >= self.interval():
            if self._flight is None:
                self._flight = asyncio.ensure_future(self._read())
            flight = self._flight
            # a viewer that goes away must not cancel the read the others wait for
            await asyncio.shield(flight)
        return Reading(self._last, self._error, self._error_at, self.interval())

    async def _read(self) -> None:
        try:
            snapshot = await read_snapshot(self.state)
        except Exception as exc:  # noqa: BLE001 - shown on the page; the next refresh retries
            error = f"{type(exc).__name__}: {exc}"
            if error != self._error:
                logger.warning("asynclock dashboard: reading the state failed: %s", error)
            self._error, self._error_at = error, time.time()
        else:
            self._last = snapshot
            self._error = self._error_at = None
            self._dead.clear()
            self.history.add(snapshot)
        finally:
            self._read_at = time.monotonic()
            self._flight = None

    async def dead_letters(self, keys: list[str]) -> dict[str, list[DeadRow]]:
        """The dead letters of ``keys`` (read concurrently, once per snapshot each)."""
        missing = [key for key in keys if key not in self._dead]
        if missing:
            seen = self._seen
            found = await asyncio.gather(*(dead_rows(self.state, key, seen) for key in missing))
            for key, rows in zip(missing, found, strict=True):
                self._dead[key] = rows
            while len(seen) > _SEEN_LIMIT:
                seen.popitem(last=False)
        return {key: self._dead[key] for key in keys}

    async def payload(self, key: str, entry: int) -> str | None:
        """The payload of ``key``'s dead letter ``entry`` (``None``: there is no such letter)."""
        if not isinstance(self.state, InboxState):
            return None
        for letter in await self.state.inbox_dead_letters(key):
            if letter.id == entry:
                return letter.payload
        return None
