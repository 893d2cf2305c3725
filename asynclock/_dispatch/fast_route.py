"""The fast route, on MemoryState: one record per event instead of a lock's machinery.

:class:`FastRoute` is the route the dispatcher picks for a state whose steps need no await
(:class:`~asynclock.state._immediate.ImmediateSteps`); what it cannot serve lean, it hands to
the general route (``general_route.py``). Its hold of a key is a :class:`LeanHold`
(``lean_hold.py``).

The common case of an embedded dispatcher is a fresh event on a free key, handled in well under
``lock_ttl / 3``. For it, :meth:`FastRoute.route_lean` skips the lock's engine: it claims
the event and takes the lock in one MemoryState step without an await, runs the handlers (the
first suspension of one is the dispatch's yield, the yield rule; if none suspends it yields
once itself), and releases (marking the claim done) in one more step. A long handler's hold is
taken over by the lock's engine at ``lock_ttl / 3`` (``lean_hold.py``).

The queued path (policy ``queue`` without a ``queue_timeout``, a key busy in this loop): the
event takes its place at the end of the key's line on arrival, records its claim in one step
and waits on a bare future until the holder's release hands the lock over
(:meth:`LeanHold.arrive`); it then runs as a fresh one would.

The folded path (``latest`` / ``debounce``, a key busy in this loop, :meth:`FastRoute.fold_lean`):
the claim recorded in one step, the event joins the key's backlog (``backlog.py``), and one
more step marks the claim done as its outcome comes back.

Invariants: the lean path runs only for exactly :class:`MemoryState` with its own steps
(:class:`asynclock.state._immediate.ImmediateSteps`, their ``steps_are_own()``); a fresh event only
on a key nobody of this process is in line for, a queued one only behind a member of this
loop's line. A busy key (held from another thread's loop, or by a direct state call) records no
lock and hands the ticket, still first in line, to the general path; so does a queued event
promoted to contend (its holder's lock was lost, or a waiter of another loop goes first). A
queued event that leaves (cancelled) passes on a lock handed to it meanwhile, at once.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import types
from typing import TYPE_CHECKING

from asynclock import metrics as _metrics
from asynclock._dedupe.claim import WaitingClaims
from asynclock._dispatch.general_route import release_failed
from asynclock._dispatch.lean_hold import LeanHold
from asynclock._events.event import HandlerContext, Outcome
from asynclock._events.handlers import resume
from asynclock._lock.acquisition import Place
from asynclock._lock.engine import line_for
from asynclock._lock.grant import granted_reason
from asynclock._owner import new_owner
from asynclock._validate import check_key
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from asynclock._dedupe.claim import EventClaim
    from asynclock._dispatch.backlog import Backlogs
    from asynclock._dispatch.context import DispatchContext
    from asynclock._dispatch.general_route import GeneralRoute
    from asynclock._events.event import Event
    from asynclock._lock.engine import Line
    from asynclock.state._immediate import ImmediateSteps

#: the context passed to handlers that take none (``(event)`` only): never read
_NONE = HandlerContext("")

# Enum members on the hot path as module constants: each ``Outcome.X`` is an enum descriptor
# lookup (0.2 µs), several per dispatched event.
_HANDLED, _DUPLICATE = Outcome.HANDLED, Outcome.DUPLICATE


class FastRoute:
    """The :class:`~asynclock._dispatch.route.Route` of a state whose steps need no await, for
    any policy but ``concurrent`` and ``supersede``: the lean paths (the module's docstring)
    where they may serve an event, the general route where not (inside
    ``process_without_lock``, the state's steps replaced, a key busy in another loop)."""

    __slots__ = (
        "backlogs",
        "context",
        "debounces",
        "folds",
        "general",
        "lean",
        "queues",
        "state",
    )

    def __init__(
        self,
        context: DispatchContext,
        lean: ImmediateSteps,
        general: GeneralRoute,
        backlogs: Backlogs,
    ) -> None:
        self.context = context
        self.state = context.state
        #: the state's steps without an await
        self.lean = lean
        self.general = general
        self.backlogs = backlogs
        policy = context.policy
        #: busy in this loop: wait in its line, lean too (no timeout to time)
        self.queues = policy == "queue" and context.queue_timeout is None
        #: busy in this loop: join the key's backlog (``latest`` / ``debounce``)
        self.folds = policy == "latest" or policy == "debounce"
        self.debounces = policy == "debounce"

    def route(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
        *,
        submitted: bool,
    ) -> Awaitable[Outcome]:
        """The lean path when it may serve ``event``, else the general route's."""
        lean = self.lean
        if granted_reason() is None and lean.steps_are_own():
            line = line_for(self.state, check_key(lock_key), loop)
            if line.member is None:
                if not line.waiters:
                    return self.route_lean(
                        lean, line, event, lock_key, claim, loop, submitted=submitted
                    )
            elif self.queues:
                # busy in this loop: wait in its line, lean too (no timeout to time)
                return self.route_lean(
                    lean, line, event, lock_key, claim, loop, submitted=submitted, queued=True
                )
            elif self.folds:
                # busy in this loop: the general path would not ask the state for the lock
                # either (the line's member is ahead), but join the backlog
                return self.fold_lean(lean, event, lock_key, claim, loop)
        return self.general.route(event, lock_key, claim, loop, submitted=submitted)

    async def route_lean(
        self,
        lean: ImmediateSteps,
        line: Line,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
        *,
        submitted: bool,
        queued: bool = False,
    ) -> Outcome:
        """The general route for a key nobody of this process is in line for, on MemoryState;
        ``queued``: for a key busy in this loop, under the ``queue`` policy (no timeout).

        One yield, one step to claim the event and take the lock (a queued event: one step to
        record its claim, then its wait in the key's line, the yield, until the lock is handed
        over), the handlers,
        one step to release the lock and mark the claim done: see the module's docstring.
        """
        context = self.context
        ttl = context.lock_ttl
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("dispatch() must run in an asyncio task")
        hold = LeanHold(context.state, lean, line, new_owner(task), ttl)
        arrived = hold.asked_at = loop.time()
        owner = hold.owner
        if queued:
            turn = hold.arrive(loop, claim)
            if turn is None:
                await asyncio.sleep(0)  # the yield rule (the wait is skipped)
                return _DUPLICATE
            try:
                # the yield rule: the line's member is ahead, so this always suspends (nothing
                # ran since the place was taken that could have handed the lock over)
                await turn
            except BaseException:
                hold.left_queue()
                raise
            token: int | None = hold.handed() or 0
        else:
            if sys.version_info < (3, 11) or task.cancelling():
                # a cancellation requested already (the task cancelled itself, or one it
                # swallowed): let it land before the event is claimed, as the yield rule has it
                # (Python 3.10 cannot tell: it always yields first)
                await asyncio.sleep(0)
            claim_key = claim.key if claim is not None else None
            line.member = hold  # the event's place in the key's line, taken on arrival
            # no yield first: the handlers' first suspension is the dispatch's yield (the yield
            # rule; one of its own only if none suspends), which spares a loop pass per event
            token = lean.claim_and_acquire_now(lock_key, owner, ttl, claim_key, ttl)
            if token is None:
                line.leave(hold)
                await asyncio.sleep(0)  # the yield rule
                return _DUPLICATE
            if token and claim is not None:
                claim.recorded_by(owner)
        if not token:  # held from elsewhere (another thread's loop, a direct state call)
            placed = Place(context.state, lock_key, ttl, auto_renew=True)
            placed.adopt_place(line, hold)
            outcome = await self.general.route(
                event, lock_key, claim, loop, submitted=submitted, placed=placed
            )
            return Outcome.QUEUED if queued and outcome is _HANDLED else outcome
        hold.held(token, claim, task, loop)
        if active.sink is not None:
            _metrics.report("lock_acquired", lock_key, loop.time() - arrived, queued)
        handlers, with_context = context.handlers.with_context(event.type)
        handled = False
        try:
            try:
                # when the lock was taken (a fresh event: on arrival; a queued one: at the
                # handover), microseconds before the handlers begin: no clock read of its own
                began = hold.asked_at
                ctx = HandlerContext(lock_key, token) if with_context else _NONE
                suspended = False
                for handler in handlers:  # call_all, one frame less at every resumption
                    result = handler.start(event, ctx)
                    if type(result) is types.CoroutineType:
                        try:
                            first = result.send(None)
                        except StopIteration:
                            continue  # done without suspending
                        suspended = True
                        await resume(result, first)
                    elif inspect.isawaitable(result):
                        suspended = True  # (at worst one yield more than needed)
                        await result
                if not suspended:
                    await asyncio.sleep(0)  # the yield rule: no handler yielded for us
                handled = True
                context.freeing.observe(lock_key, loop.time() - began)
                if claim is not None:
                    claim.handled_now()
            except BaseException as body_error:
                await hold.failed(body_error)
                raise
            if not hold.handled_at_once(context.done_ttl):
                await hold.handled(context.done_ttl)
        except Exception as error:
            if not handled:
                raise
            release_failed(event, lock_key, claim, error)
        except BaseException:
            if handled and claim is not None:
                claim.release_failed()
            raise
        return Outcome.QUEUED if queued else _HANDLED

    async def fold_lean(
        self,
        lean: ImmediateSteps,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
    ) -> Outcome:
        """The general route for a key busy in this loop under ``latest``/``debounce``, on
        MemoryState: one step records the claim (a duplicate is answered at once), the event
        joins the key's backlog, where its claim's lease is renewed with the backlog's
        (:class:`WaitingClaims`, no timer of its own), and one more step marks the claim done as
        its outcome comes back. The wait for the outcome is the dispatch's yield."""
        context = self.context
        ttl = context.lock_ttl
        if claim is not None:
            owner = new_owner(asyncio.current_task(loop))
            if not lean.claim_now(claim.key, owner, ttl):
                await asyncio.sleep(0)  # the yield rule
                return _DUPLICATE
            claim.recorded_by(owner)
        backlog, outcome = self.backlogs.entry(event, lock_key, self.debounces, loop)
        if claim is None:
            return await outcome
        claims = backlog.claims
        if claims is None:
            claims = backlog.claims = WaitingClaims(context.state, ttl)
        claims.add(claim, loop)
        try:
            concluded = await outcome
        finally:
            claims.remove(claim)
        if not claim.keeping:  # (else its keeper is stopped first, by the general finish)
            lean.keep_now(claim.key, context.done_ttl)
            claim.done_in_step()
        return concluded
