"""Marking a handled event's claim done, retried in the background while the state is away.

A handled event whose done mark fails (the state unreachable) would have its claim lapse with
its lease, and a redelivery would then run the handlers a second time. :class:`DoneMarks`
retries the mark until the state answers (or the record would have expired anyway), with a
doubling delay capped at ``lock_ttl / 3``. ``aclose()`` cancels what is still retrying: each
such claim then lapses with its lease (at least once).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from asynclock._errors import StateUnavailableError

if TYPE_CHECKING:
    from asynclock._dedupe.claim import EventClaim
    from asynclock._dispatch.context import DispatchContext

logger = logging.getLogger("asynclock")


class DoneMarks:
    """The done marks of one dispatcher, and the background retries of those that failed."""

    __slots__ = ("context", "retrying")

    def __init__(self, context: DispatchContext) -> None:
        self.context = context
        #: the retries running now (cancelled by :meth:`cancel`)
        self.retrying: set[asyncio.Task[None]] = set()

    async def finish(self, claim: EventClaim) -> None:
        """Mark a handled event's claim done; if the state is out of reach, keep trying.

        The claim's lease is no longer renewed, so it lapses within ``lock_ttl``; a retry that
        gets through once the state is back (before a redelivery arrives) still saves that
        redelivery from running the handlers a second time.
        """
        context = self.context
        if not await claim.finish(context.state, context.done_ttl):
            task = asyncio.get_running_loop().create_task(
                self.mark_done_later(claim.key), name=f"asynclock-mark-done {claim.key!r}"
            )
            self.retrying.add(task)
            task.add_done_callback(self.retrying.discard)

    async def mark_done_later(self, key: str) -> None:
        """Retry the done mark of claim ``key`` until the state takes it (or it is moot)."""
        context = self.context
        loop = asyncio.get_running_loop()
        give_up = loop.time() + context.dedupe_ttl  # the record would have expired by then
        delay = 0.05
        while loop.time() < give_up:
            await asyncio.sleep(delay)
            try:
                await context.state.dedupe_keep(key, context.done_ttl)
            except StateUnavailableError:
                delay = min(delay * 2, context.lock_ttl / 3)
                continue
            except Exception:  # the state was closed, say: nothing left to retry with
                logger.warning("asynclock: gave up marking event claim %r done", key, exc_info=True)
                return
            logger.info("asynclock: marked event claim %r done after a retry", key)
            return

    async def cancel(self) -> None:
        """Stop every retry still running, and wait until each has stopped."""
        # retries of "done" marks run until the state answers: not worth waiting for at exit
        # (each claim then lapses with its lease: at least once)
        retrying = tuple(self.retrying)
        for task in retrying:
            task.cancel()
        await asyncio.gather(*retrying, return_exceptions=True)
