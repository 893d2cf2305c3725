"""The dispatcher's route under ``on_lock_conflict="supersede"``, and its inbox's supersede parts.

:class:`SupersedeRoute` is the route (``_dispatch/route.py``) ``EventDispatcher`` picks under
``supersede``, on every state: an event joins its key's :class:`SupersedeLine` (``line.py``),
interrupting the key's running call, and its outcome comes once the call covering it returned.
For ``accept()`` / ``serve()`` it also gives the durable inbox what supersede changes there
(:meth:`SupersedeRoute.inbox_drain`, :meth:`SupersedeRoute.accepted`: ``inbox.py``).

It takes what it needs of the dispatcher as arguments (the dispatcher's claim check and its
task spawner among them), so this package never imports the dispatcher's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock._events.event import Outcome
from asynclock._supersede.inbox import SupersedingDrain, signal_holder
from asynclock._supersede.line import SupersedeLine
from asynclock._supersede.line import Waiting as Superseding
from asynclock._supersede.line import drain as drain_superseding

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable, Callable

    from asynclock._dedupe.claim import EventClaim
    from asynclock._events.event import Event, Recorder
    from asynclock._events.handlers import HandlerTable
    from asynclock.state._protocol import InboxState, State

_DUPLICATE = Outcome.DUPLICATE


class SupersedeRoute:
    """The supersede lines of one dispatcher (per key, in this process) and their drainers.

    Invariants: a key's line stays in :attr:`lines` while an event waits in it or its drainer
    runs, and goes once neither holds (nothing awaited between the check and the removal).
    """

    __slots__ = (
        "carry_ttl",
        "claim_alone",
        "grace",
        "handlers",
        "lines",
        "lock_ttl",
        "spawn",
        "state",
    )

    def __init__(
        self,
        state: State,
        handlers: HandlerTable,
        *,
        lock_ttl: float,
        grace: float | None,
        carry_ttl: float,
        claim_alone: Callable[[EventClaim], Awaitable[bool]],
        spawn: Callable[[Awaitable[object], str], asyncio.Task[object]],
    ) -> None:
        self.state = state
        self.handlers = handlers
        self.lock_ttl = lock_ttl
        #: ``supersede_grace``: seconds from the interruption to the cancellation of the call
        self.grace = grace
        #: ``dedupe_ttl``: how long events handed over to another process wait in the state
        self.carry_ttl = carry_ttl
        #: records a claim by a call of its own (``False``: a duplicate)
        self.claim_alone = claim_alone
        #: runs a drainer in a background task the dispatcher's ``aclose()`` waits for
        self.spawn = spawn
        #: the events and running call of each key, in this process
        self.lines: dict[str, SupersedeLine] = {}

    async def route(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
        *,
        submitted: bool,
    ) -> Outcome:
        """Join ``lock_key``'s supersede line (``_supersede/line.py``), interrupting its running
        call; the outcome comes once the call covering the event returned."""
        line = self.lines.get(lock_key)
        if line is None:
            line = self.lines[lock_key] = SupersedeLine()
        future: asyncio.Future[Outcome] = loop.create_future()
        waiting = Superseding(event, future)
        line.arrive(waiting)  # its place in the line (skipped order), taken on arrival
        try:
            duplicate = claim is not None and not await self.claim_alone(claim)
        except BaseException:
            self.leave(lock_key, line, waiting)
            raise
        if duplicate:
            self.leave(lock_key, line, waiting)
            return _DUPLICATE
        line.ready(waiting)
        if line.drainer is None:
            line.drainer = self.spawn(self.drain(lock_key, line), "supersede")
        return await future

    def leave(self, lock_key: str, line: SupersedeLine, waiting: Superseding) -> None:
        """``waiting`` is not handled (a duplicate, its claim failed): its place goes, and the
        line too when nothing else is in it."""
        line.leave(waiting)
        if (
            line.drainer is None
            and not line.entries
            and not line.carried
            and self.lines.get(lock_key) is line
        ):
            del self.lines[lock_key]

    async def drain(self, lock_key: str, line: SupersedeLine) -> None:
        """Serve ``lock_key``'s line until nothing waits (:func:`~asynclock._supersede.line.drain`)."""
        try:
            await drain_superseding(
                self.state,
                lock_key,
                line,
                self.handlers,
                ttl=self.lock_ttl,
                grace=self.grace,
                carry_ttl=self.carry_ttl,
            )
        finally:
            line.drainer = None
            # nothing awaited between the drainer's last check and this: a later arrival
            # starts a new drainer
            if not line.entries and self.lines.get(lock_key) is line:
                del self.lines[lock_key]

    def inbox_drain(
        self,
        inbox: InboxState,
        *,
        max_attempts: int,
        record: Recorder,
        observe: Callable[[str, float], None],
    ) -> SupersedingDrain:
        """How ``serve()`` drains a held key under ``supersede`` (``_supersede/inbox.py``)."""
        return SupersedingDrain(
            self.state,
            inbox,
            self.handlers,
            grace=self.grace,
            max_attempts=max_attempts,
            record=record,
            observe=observe,
        )

    async def accepted(self, lock_key: str) -> None:
        """An event of ``lock_key`` was stored: interrupt the call that drains the key now, in
        whichever worker."""
        await signal_holder(self.state, lock_key)
