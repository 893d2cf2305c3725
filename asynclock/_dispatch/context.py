"""What every part of one dispatcher shares: its settings, its state and its background tasks.

:class:`DispatchContext` is made once by ``EventDispatcher.__init__`` (which validates the
settings first) and handed to the routes (``general_route.py``, ``fast_route.py``), the backlog
drain (``backlog.py``), the done-mark retries (``done_marks.py``) and the delivery answers
(``delivery.py``): each reads the settings it needs from it, none keeps a copy that could drift.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from asynclock._dispatch.freeing import FreeingEstimate
from asynclock.state._protocol import ClaimingState, DedupeReading

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from asynclock._dedupe.claim import EventClaim
    from asynclock._dispatch.policies import ConflictPolicy
    from asynclock._events.handlers import HandlerTable
    from asynclock.state._protocol import State


class DispatchContext:
    """One dispatcher's settings, state, handler table and running background tasks.

    Invariants: the settings never change after construction; :attr:`tasks` holds every task
    :meth:`spawn` started until it is done (``aclose()`` waits for them).
    """

    __slots__ = (
        "claiming",
        "debounce",
        "dedupe_ttl",
        "done_ttl",
        "freeing",
        "handlers",
        "lock_ttl",
        "policy",
        "queue_timeout",
        "reading",
        "state",
        "supersede_grace",
        "tasks",
    )

    def __init__(
        self,
        state: State,
        handlers: HandlerTable,
        *,
        policy: ConflictPolicy,
        lock_ttl: float,
        dedupe_ttl: float,
        debounce: float,
        queue_timeout: float | None,
        supersede_grace: float | None,
    ) -> None:
        self.state = state
        self.handlers = handlers
        self.policy = policy
        self.lock_ttl = lock_ttl
        self.dedupe_ttl = dedupe_ttl
        # a done record outlives every lease (at most lock_ttl) for the whole dedupe_ttl, so its
        # remaining time alone tells it from an in-progress claim (see deliver())
        self.done_ttl = dedupe_ttl + lock_ttl
        self.debounce = debounce
        self.queue_timeout = queue_timeout
        self.supersede_grace = supersede_grace
        #: how long each key's handling takes here: the ``Retry-After`` estimate
        self.freeing = FreeingEstimate()
        #: the state as a ClaimingState, if it is one
        self.claiming = state if isinstance(state, ClaimingState) else None
        #: the state as a DedupeReading, if it is one
        self.reading = state if isinstance(state, DedupeReading) else None
        #: submitted dispatches and backlog drainers still running (``in_flight``)
        self.tasks: set[asyncio.Task[object]] = set()

    def spawn(self, work: Awaitable[object], what: str) -> asyncio.Task[object]:
        """Run ``work`` in a task named after ``what``, kept in :attr:`tasks` until it is done."""
        task: asyncio.Task[object] = asyncio.ensure_future(work)
        task.set_name(f"asynclock {what}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def claim_alone(self, claim: EventClaim) -> bool:
        """Record ``claim`` in progress by a call of its own; ``False``: it is a duplicate."""
        if not await self.state.dedupe_add(claim.key, self.lock_ttl):
            return False
        claim.keep(self.state, self.lock_ttl)
        return True
