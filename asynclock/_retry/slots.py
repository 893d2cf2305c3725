"""Retry slots shared by every worker: distinct whole seconds per busy key, claimed in the state.

:class:`~asynclock._dispatch.freeing.FreeingEstimate` spaces the retries one process promises on a key;
two workers of one deployment still promise the same seconds, and of two retries that land
together one is dropped again. :class:`RetrySlots` makes the promise a claim: a dedupe record
per key and whole second (``dedupe_add``, atomic set-if-absent on every backend), so a second
promised by one worker is skipped by every other. Seconds are the wall clock's (every worker
must read the same second: NTP-synchronised hosts do), because ``Retry-After`` is counted from
the moment the answer is sent.

Invariants: at most ``len(PROBES)`` round trips per promise; nothing is claimed past the cap; a
state that cannot be reached makes no promise (the caller keeps its own estimate).
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

from asynclock._errors import StateUnavailableError

if TYPE_CHECKING:
    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")

#: seconds tried (offsets from the first one wanted) before a promise falls back to the local
#: estimate: the next few, then further and further, so a long run of taken seconds (a burst's
#: promises made by other workers) is crossed in a few round trips
PROBES = (0, 1, 2, 4, 8)


class RetrySlots:
    """Claims whole-second retry slots per key in ``state``, for every worker of a deployment."""

    __slots__ = ("_clock", "_state")

    def __init__(self, state: State) -> None:
        self._state = state
        self._clock = time.time

    async def claim(self, key: str, after: float, *, cap: float) -> float | None:
        """Claim the first free whole second at least ``after`` seconds from now, within ``cap``.

        Returns the seconds from now to the claimed second, or ``None`` when every second of
        :data:`PROBES` was taken or past ``cap``, or the state is unavailable.
        """
        now = self._clock()
        first = math.ceil(now + after)
        for offset in PROBES:
            second = first + offset
            wait = second - now
            if wait > cap:
                return None
            # under the key's hash tag, like the event claims: one node of a cluster holds both
            record = f"retry-slot:{{{key}}}:{second}"
            try:
                if await self._state.dedupe_add(record, wait + 1.0):
                    return wait
            except StateUnavailableError as exc:
                logger.debug("asynclock: retry slot of %r not claimed: %s", key, exc)
                return None
        return None
