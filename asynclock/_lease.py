"""LeaseKeeper: keeps an *in progress* dedupe claim alive while its work runs.

Two-phase claims (``Deduper.claim``, ``EventDispatcher``) record an event as in progress for a
short lease and only mark it done, for the full dedupe TTL, once it was handled: a worker that
dies mid-event then hides the platform's redelivery for at most the lease.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")


class LeaseKeeper:
    """Renews an *in progress* dedupe claim every ``lease/3`` seconds until :meth:`stop`.

    Lazy: nothing but a timer exists until the first renewal is due, so work shorter than
    ``lease/3`` costs no task and no round trip. Invariant: once :meth:`stop` has returned, no
    renewal is on the wire and none will be sent, so the caller's next write to the record
    (*done* with the full TTL, or forget) is the last one; a renewal is never cancelled
    mid-flight, because it could then land after that write and undo it.
    """

    __slots__ = ("_handle", "_lease", "_renewing", "_state", "_stopped", "_task", "key")

    def __init__(self, state: State, key: str, lease: float) -> None:
        self._state = state
        self.key = key
        self._lease = lease
        self._task: asyncio.Task[None] | None = None
        self._renewing = False
        self._stopped = False
        self._handle = asyncio.get_running_loop().call_later(lease / 3, self._start)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"asynclock-lease {self.key!r}"
        )

    async def _run(self) -> None:
        while True:  # stop() cancels the task before its first step or between renewals
            self._renewing = True
            try:
                await self._state.dedupe_keep(self.key, self._lease)
            except Exception as exc:  # noqa: BLE001 - the lease may lapse: a redelivery may run
                logger.warning(
                    "asynclock: could not renew the claim lease of %r: %s", self.key, exc
                )
            finally:
                self._renewing = False
            if self._stopped:
                return
            await asyncio.sleep(self._lease / 3)

    async def stop(self) -> None:
        """Stop renewing; returns once no renewal is in flight. Idempotent."""
        self._stopped = True
        self._handle.cancel()
        task = self._task
        if task is None or task.done():
            return
        if not self._renewing:
            task.cancel()  # asleep between renewals: nothing on the wire
        await asyncio.wait({task})
