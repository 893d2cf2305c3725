"""The lock's engine, contended: waiting in this process's line, contending at the server.

:class:`Acquisition` is the engine's one class of objects: the uncontended part, its base
:class:`~asynclock._lock.engine.Engine` (a place in the key's line, one try, holding, the
release; ``engine.py``), and here what only a busy key runs: ``AsyncLock.acquire`` with its
blocking and timeout, waiting in line to be handed the lock (or for the turn to contend),
contending (attempts at the server, woken by releases), abandoning a wait, waiting from a place
kept (:meth:`Acquisition.wait_turn`) or leaving it, and taking over a place or a hold of the
dispatcher's lean path. :class:`~asynclock.AsyncLock` is its public face (``lock.py``); the
dispatcher, the inbox's drainers and the event claims make an ``Acquisition`` of their own where
they need more than that face (``Place`` is its name for the dispatcher).
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from typing import TYPE_CHECKING

from asynclock._cancel import BodyCanceller, finish_despite_cancellation, run_in_background
from asynclock._errors import LockAcquisitionError
from asynclock._lock.engine import Engine, handed_token, join_line, left_to, release_chain
from asynclock._lock.grant import granted_reason
from asynclock._lock.renew import Renewer
from asynclock._lock.turn import current_turn
from asynclock._validate import check_seconds
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from asynclock._lock.engine import Line, Ticket

logger = logging.getLogger("asynclock")

# A waiter re-checks a holder that should have expired this long after its expected expiry;
# covers the small gap between the client's estimate and the server's clock.
EXPIRY_GRACE = 0.005
# Never re-ask the server sooner than this after it said the holder's lock expires "now".
MIN_WAIT = 0.001


class Acquisition(Engine):
    """A lock's acquisitions of one key, one at a time: :class:`Engine` and, when the key is
    busy, the waiting (see :class:`Engine` for the invariants).

    Invariants (besides :class:`Engine`'s): at every await, a cancelled wait leaves nothing
    behind: a lock handed over meanwhile is passed on (or released) before the
    ``CancelledError`` goes on, and the line forgets the ticket. A lock handed over to a place
    is never lost: it is taken (:meth:`wait_turn`) or passed on (:meth:`leave_place`).
    """

    __slots__ = ()

    # -- acquire ------------------------------------------------------------------------------

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """``AsyncLock.acquire`` (``None``: the constructor's ``blocking``, ``timeout``).

        ``True`` once acquired (or granted); ``False`` for a non-blocking attempt that found the
        lock held. Raises ``LockAcquisitionError`` when a blocking acquire's timeout runs out.
        """
        if blocking is None:
            blocking = self.blocking
        if timeout is None:
            timeout = self.timeout
        else:
            timeout = check_seconds(timeout, "timeout", key=self.key, allow_zero=True)
        if self.busy or self.token is not None or self.granted:
            raise RuntimeError(
                f"AsyncLock {self.key!r} is already held or being acquired by this object; "
                "locks are not reentrant: create one AsyncLock per acquisition"
            )
        reason = granted_reason()
        if reason is not None:
            await asyncio.sleep(0)  # the yield rule holds here too
            self.granted = True
            logger.debug("asynclock: lock %r granted without acquiring (%s)", self.key, reason)
            return True
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout if blocking and timeout is not None else None
        self.busy = True
        self.contended = False
        try:
            task = asyncio.current_task()
            line, ticket = self.new_ticket(task)
            lean = self.lean
            if (
                line.member is None
                and lean is not None
                and self.first_attempt is None
                and current_turn() is None
                and lean.steps_are_own()
            ):
                # the lean path: the line's member at once, one yield, one step
                line.member = ticket
                ticket.asked_at = started
                try:
                    await asyncio.sleep(0)  # the yield rule; nothing was asked of the state yet
                except BaseException:
                    line.leave(ticket)
                    raise
                token = lean.token_now(self.key, ticket.owner, self.ttl)
                if token is not None:
                    acquired = self.won(line, ticket, token, task=task)
                else:  # busy: held from elsewhere (another thread's loop, a direct state call)
                    acquired = await self.contend(line, ticket, bool(blocking), deadline)
            else:
                acquired = await self.acquire_in_line(line, ticket, bool(blocking), deadline)
        finally:
            self.busy = False
        if active.sink is not None:
            self.report(acquired, started)
        if acquired or not blocking:
            return acquired
        raise LockAcquisitionError(self.key, self.ttl, self.retry_after)

    async def enter(self) -> None:
        """``async with``'s entry (``AsyncLock.__aenter__``); :meth:`Engine.exit` leaves it."""
        await self.acquire()  # raises LockAcquisitionError when a timeout runs out
        self.entered()

    async def acquire_in_line(
        self, line: Line, ticket: Ticket, blocking: bool, deadline: float | None
    ) -> bool:
        """The general path of :meth:`acquire` for the fresh ``ticket`` in ``line``."""
        if line.member is None:
            line.member = ticket
            return await self.contend(line, ticket, blocking, deadline)
        if not blocking:
            # a local holder: one try at the server anyway, which also takes over a lock whose
            # holder let it expire
            grant = await self.attempt(line, ticket, waiting=False)
            if grant.token is not None:
                return self.won(line, ticket, grant.token)
            self.retry_after = grant.retry_after
            return False
        join_line(line, ticket)
        return await self.wait_in_line(line, ticket, deadline)

    # -- waiting and contending ---------------------------------------------------------------

    async def wait_in_line(self, line: Line, ticket: Ticket, deadline: float | None) -> bool:
        """As a waiter of ``line``: wait to be handed the lock, or for our turn to contend."""
        loop = asyncio.get_running_loop()
        self.contended = True
        future = ticket.future
        assert future is not None
        while True:
            member = line.member
            bound = member.expires + EXPIRY_GRACE if member is not None else math.inf
            if deadline is not None:
                bound = min(bound, deadline)
            try:
                await wait_for_turn(future, bound)
            except asyncio.CancelledError:
                await self.abandon_waiting(line, ticket)
                raise
            if future.done():
                result = future.result()
                if result is not None:
                    return self.won(line, ticket, result, handed=True)
                return await self.contend(line, ticket, True, deadline)
            if ticket not in line.waiters:
                # popped by a release that is handing the lock to us right now: its answer
                # comes within the backend's operation timeout, so wait for it, even past
                # the deadline (giving up now would leave the lock to nobody)
                continue
            if deadline is not None and loop.time() >= deadline:
                future.cancel()
                line.drop_waiter(ticket)
                self.retry_after = left_to(line.member, loop.time())
                return False
            # the holder should have expired by now without releasing: the head of the line
            # takes over and contends on the server (the others keep waiting)
            holder_gone = member is None or loop.time() >= member.expires
            if holder_gone and line.member is member and line.waiters[0] is ticket:
                line.waiters.popleft()
                future.cancel()
                line.member = ticket
                return await self.contend(line, ticket, True, deadline)

    async def abandon_waiting(self, line: Line, ticket: Ticket) -> None:
        """A waiter was cancelled: leave the line, passing on whatever it was just given.

        A lock handed over just before the cancellation is passed on (or released) before the
        cancellation goes on, so the key is never left to a task that is gone.
        """
        future = ticket.future
        if future is None or not future.done() or future.cancelled():
            if future is not None:
                future.cancel()
            line.drop_waiter(ticket)
            return
        token = future.result()
        if token is None:
            # Promoted to contend, maybe after a handoff of unknown outcome: make sure this
            # owner holds nothing before the next waiter goes.
            try:
                await finish_despite_cancellation(self.state.abandon(self.key, ticket.owner))
            finally:
                line.leave(ticket)
        else:
            await finish_despite_cancellation(release_chain(self.state, line, ticket))

    async def contend(
        self, line: Line, ticket: Ticket, blocking: bool, deadline: float | None
    ) -> bool:
        """As the line's member, take the lock from the server (waiting for releases)."""
        won = flagged = False
        try:
            grant = await self.attempt(line, ticket, waiting=False)
            if grant.token is not None:
                won = True
                return self.won(line, ticket, grant.token)
            if not blocking:
                self.retry_after = grant.retry_after
                return False
            loop = asyncio.get_running_loop()
            self.contended = True
            async with self.state.watch(self.key) as watch:
                while True:
                    watch.reset()
                    flagged = True
                    grant = await self.attempt(line, ticket, waiting=True)
                    if grant.token is not None:
                        won = True
                        return self.won(line, ticket, grant.token)
                    self.retry_after = grant.retry_after
                    wait = max(grant.retry_after or 0.0, MIN_WAIT)
                    if deadline is not None:
                        left = deadline - loop.time()
                        if left <= 0:
                            return False
                        wait = min(wait, left)
                    await watch.wait(wait)
        finally:
            if not won:
                line.leave(ticket)
                if flagged and line.member is None:
                    # nobody of this process waits for the key any more: withdraw our flag or
                    # reservation, so other processes are not kept waiting for us
                    withdraw = self.state.abandon(self.key, ticket.owner)
                    if sys.exc_info()[0] is asyncio.CancelledError:
                        await finish_despite_cancellation(withdraw)
                    else:
                        run_in_background(withdraw)

    # -- from a place kept --------------------------------------------------------------------

    async def wait_turn(self, deadline: float | None) -> bool:
        """Wait from the place kept until the lock is ours (``False``: ``deadline`` passed)."""
        ticket, line = self.ticket, self.line
        assert self.placed
        assert ticket is not None
        assert line is not None
        placed_at = self.held_since
        self.busy = True
        try:
            handed = handed_token(ticket)
            if handed is not None:
                won = self.won(line, ticket, handed, handed=True)
            elif line.member is ticket:
                won = await self.contend(line, ticket, True, deadline)
            else:
                won = await self.wait_in_line(line, ticket, deadline)
        finally:
            self.placed = False
            self.busy = False
        self.contended = True
        if won:
            self.report(True, placed_at)
        return won

    async def leave_place(self) -> None:
        """Give the place up, passing on a lock handed over meanwhile. Idempotent."""
        ticket, line = self.ticket, self.line
        if not self.placed or ticket is None or line is None:
            return
        self.placed = False
        if ticket.future is not None:
            await self.abandon_waiting(line, ticket)
        else:  # the member, with nothing on the server: its one attempt found the key busy
            line.leave(ticket)

    # -- handed over by the dispatcher's lean path --------------------------------------------

    def adopt_place(self, line: Line, ticket: Ticket) -> None:
        """``take_place`` with ``ticket``, the member of ``line`` already (the dispatcher's
        lean path hands its place over when it found the key busy)."""
        self.use_ticket(line, ticket)
        self.placed_now()

    def adopt_held(
        self, line: Line, ticket: Ticket, token: int, since: float, body: BodyCanceller
    ) -> None:
        """Take over a lock the dispatcher's lean path acquired for ``ticket`` at ``since``, as if
        this object had acquired it and entered ``async with`` with ``body``; renew it from now.

        Only renewal and the release are left to this object (its first renewal is due now).
        """
        self.use_ticket(line, ticket)
        self.token = token
        self.held_since = since
        self.body = body
        self.renewer = Renewer(
            self.state, self.key, ticket, self.ttl, None, self.on_lost, started=since
        )


#: the dispatcher's name for an acquisition that takes its place in the key's line on arrival
#: (``Engine.take_place``) and tries or waits from there later
Place = Acquisition


async def wait_for_turn(future: asyncio.Future[int | None], until: float) -> None:
    """Wait until a waiter's ``future`` is done, or until loop time ``until`` (``inf``: no limit).

    ``asyncio.wait((future,), timeout=...)`` for one future, without its generality (a set, a
    check of every awaitable, an inner coroutine): a third of a queued event's waiting cost.
    Like it, this never cancels ``future``; a cancellation of the caller only ends the wait.
    """
    if future.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    handle = loop.call_at(until, wake) if until != math.inf else None
    try:
        await waiter
    finally:
        if handle is not None:
            handle.cancel()
        future.remove_done_callback(wake)
