"""The pause between two deliveries of an inbox entry whose handler failed in the lock.

Shared by the durable inbox's three drains (one entry at a time, the batches of
``latest``/``debounce``, the interruptions of ``supersede``), so a failing key backs off the same
way whichever policy drains it: 50 ms, doubling per failure in a row, at most
:data:`MAX_RETRY_PAUSE`; a delivery that does not fail starts the count again.
"""

from __future__ import annotations

import asyncio

__all__ = ["MAX_RETRY_PAUSE", "Backoff"]

#: the longest pause between two deliveries of an entry whose handler failed
MAX_RETRY_PAUSE = 5.0
#: the first pause
FIRST_PAUSE = 0.05


class Backoff:
    """The failures in a row of one drain, and the pause they call for.

    Invariant: ``failures`` counts the failed deliveries since the last one that did not fail.
    """

    __slots__ = ("failures",)

    def __init__(self) -> None:
        self.failures = 0

    async def failed(self) -> None:
        """Count a failed delivery and pause before the next one."""
        self.failures += 1
        await asyncio.sleep(min(FIRST_PAUSE * 2 ** (self.failures - 1), MAX_RETRY_PAUSE))

    def succeeded(self) -> None:
        """A delivery did not fail: the next failure pauses the shortest time again."""
        self.failures = 0
