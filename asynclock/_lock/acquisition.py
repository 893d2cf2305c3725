"""The lock's engine: :class:`Acquisition`, one per lock object, one acquisition at a time.

:class:`~asynclock.AsyncLock` is its public face (``lock.py``). The dispatcher, the inbox's
drainers and the event claims make an ``Acquisition`` of their own where they need more than
that face: their own work folded into the acquire and release steps, a lock the state (or the
dispatcher's lean path) acquired already, a place in the key's line kept across their awaits
(:class:`~asynclock._lock.place.Place`, ``place.py``). This module is the acquiring half:
acquire, the attempts at the server, contending and waiting in this process's line for the key
(the line itself is in ``waiters.py``); the holding half, the base class
:class:`~asynclock._lock.holding.Hold`, is in ``holding.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from typing import TYPE_CHECKING

from asynclock import metrics as _metrics
from asynclock._cancel import BodyCanceller, finish_despite_cancellation, run_in_background
from asynclock._errors import LockAcquisitionError
from asynclock._lock.grant import granted_reason
from asynclock._lock.holding import Hold
from asynclock._lock.renew import Renewer
from asynclock._lock.turn import current_turn
from asynclock._lock.waiters import Line, Ticket, line_for, release_chain, wait_for_turn
from asynclock._owner import new_owner
from asynclock._validate import check_seconds
from asynclock.metrics._active import active
from asynclock.state._immediate import immediate_steps
from asynclock.state._protocol import Grant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")

NOT_GRANTED = Grant(None, None)

# A waiter re-checks a holder that should have expired this long after its expected expiry;
# covers the small gap between the client's estimate and the server's clock.
EXPIRY_GRACE = 0.005
# Never re-ask the server sooner than this after it said the holder's lock expires "now".
MIN_WAIT = 0.001


class Acquisition(Hold):
    """A lock's acquisitions of one key, one at a time, by the task that made each.

    The arguments are the checked ones of :class:`~asynclock.AsyncLock` (whose docstring says
    what each means); nothing here checks them again.

    Invariants (besides :class:`Hold`'s):

    * Every acquisition gets a fresh owner id and :class:`~asynclock._lock.waiters.Ticket`; only
      the line's member asks the server, the others wait in arrival order (``waiters.py``).
    * ``busy`` while an acquire or a place's attempt runs. Acquiring while busy, held or granted
      raises ``RuntimeError`` (not reentrant); so does taking a place or a lock handed out
      (:meth:`hold_granted`) while placed as well.
    * Cancellation: at every await, a cancelled acquisition leaves nothing behind: an attempt
      whose outcome is unknown is undone at the server, a lock handed over meanwhile is passed on
      (or released) before the ``CancelledError`` goes on, and the line forgets the ticket.
    * ``refused``: the armed first attempt (:meth:`arm_first_attempt`) refused; the lock was
      not acquired (and a :class:`~asynclock._lock.place.Place`'s place is gone).
    """

    __slots__ = (
        "blocking",
        "busy",
        "contended",
        "first_attempt",
        "first_attempt_now",
        "placed",
        "refused",
        "retry_after",
        "timeout",
    )

    def __init__(
        self,
        state: State,
        key: str,
        ttl: float,
        blocking: bool = True,
        timeout: float | None = None,
        auto_renew: bool = False,
        max_lifetime: float | None = None,
    ) -> None:
        self.key = key
        self.ttl = ttl
        self.timeout = timeout
        self.max_lifetime = max_lifetime
        self.state = state
        # the lean path (docs/decisions.md): a state whose steps need no await (MemoryState),
        # so the lock yields once itself and acts at once
        self.lean = immediate_steps(state)
        self.blocking = blocking
        self.auto_renew = auto_renew
        self.owner = ""
        self.token = None
        self.ticket = None
        self.line = None
        self.task = None
        self.busy = False
        #: the acquire waited (for a handover or a release) before it got the lock
        self.contended = False
        self.held_since = 0.0
        self.granted = False
        #: a place taken in the key's line, not yet tried from or left (``place.py``)
        self.placed = False
        self.refused = False
        self.first_attempt: Callable[[str], Awaitable[Grant | None]] | None = None
        self.first_attempt_now: Callable[[str], Grant | None] | None = None
        self.last_token = None
        self.lost = False
        #: after a failed acquire: seconds until the holder's lock expires, if known
        self.retry_after: float | None = None
        self.renewer = None
        self.body = None

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

    def entered(self) -> None:
        """After :meth:`acquire` for ``async with``: the body begins (raises
        ``LockAcquisitionError`` if a non-blocking acquire found the lock held)."""
        if self.granted:
            return
        if self.token is None:
            raise LockAcquisitionError(self.key, self.ttl, self.retry_after)
        self.start_holding()

    async def enter(self) -> None:
        """``async with``'s entry (``AsyncLock.__aenter__``); :meth:`Hold.exit` leaves it."""
        await self.acquire()  # raises LockAcquisitionError when a timeout runs out
        self.entered()

    def report(self, acquired: bool, started: float) -> None:
        """Report the acquire begun at loop time ``started`` to the metrics sink, if any."""
        if active.sink is not None:
            if acquired:
                waited = asyncio.get_running_loop().time() - started
                _metrics.report("lock_acquired", self.key, waited, self.contended)
            else:
                _metrics.report("lock_conflict", self.key)

    def new_ticket(self, task: asyncio.Task[object] | None = None) -> tuple[Line, Ticket]:
        """A fresh acquisition: a new owner id and its ticket in this process's line for the key.

        ``task``: the current task, when the caller has it at hand already.
        """
        line, ticket = line_for(self.state, self.key), Ticket(new_owner(task), self.ttl)
        self.use_ticket(line, ticket)
        return line, ticket

    def use_ticket(self, line: Line, ticket: Ticket) -> None:
        """Make ``ticket`` of ``line`` the current acquisition's (not held yet)."""
        self.owner = ticket.owner
        self.lost = False
        self.refused = False
        self.retry_after = None
        self.ticket, self.line = ticket, line

    def check_idle(self) -> None:
        """Raise ``RuntimeError`` if the lock is held, granted, being acquired or placed."""
        if self.busy or self.placed or self.token is not None or self.granted:
            raise RuntimeError(f"AsyncLock {self.key!r} is already held or being acquired")

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
        self,
        line: Line,
        ticket: Ticket,
        blocking: bool,
        deadline: float | None,
        *,
        keep_place: bool = False,
    ) -> bool:
        """As the line's member, take the lock from the server (waiting for releases).

        With ``keep_place``, a non-blocking attempt that finds the key busy leaves ``ticket``
        the line's member (see :meth:`take_place`).
        """
        won = flagged = kept = False
        try:
            grant = await self.attempt(line, ticket, waiting=False)
            if grant.token is not None:
                won = True
                return self.won(line, ticket, grant.token)
            if not blocking:
                self.retry_after = grant.retry_after
                kept = keep_place and not self.refused
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
            if not won and not kept:
                line.leave(ticket)
                if flagged and line.member is None:
                    # nobody of this process waits for the key any more: withdraw our flag or
                    # reservation, so other processes are not kept waiting for us
                    withdraw = self.state.abandon(self.key, ticket.owner)
                    if sys.exc_info()[0] is asyncio.CancelledError:
                        await finish_despite_cancellation(withdraw)
                    else:
                        run_in_background(withdraw)

    async def attempt(self, line: Line, ticket: Ticket, *, waiting: bool) -> Grant:
        """One server acquire. If its outcome is unknown (cancelled, timed out), undo it."""
        ticket.asked_at = asyncio.get_running_loop().time()
        try:
            first = self.first_attempt
            if first is not None and not waiting:
                self.first_attempt = None
                grant = await first(ticket.owner)
                if grant is None:
                    self.refused = True
                    return NOT_GRANTED
                return grant
            turn = current_turn()
            if turn is not None and not waiting:
                # a fair retry (asynclock._lock.turn): take the key only in first-conflict order
                return await turn.acquire(self.state, self.key, ticket.owner, self.ttl)
            return await self.state.acquire(self.key, ticket.owner, self.ttl, waiting=waiting)
        except asyncio.CancelledError:
            # The server may have granted the lock, or may still if the command is on the
            # wire. Undo it before the cancellation goes on, so the key is free once the task
            # is done (bounded by the backend's operation timeout).
            await finish_despite_cancellation(self.state.abandon(self.key, ticket.owner))
            raise
        except BaseException:
            run_in_background(self.state.abandon(self.key, ticket.owner))
            raise

    def arm_first_attempt(
        self,
        attempt: Callable[[str], Awaitable[Grant | None]],
        now: Callable[[str], Grant | None] | None = None,
    ) -> None:
        """Send ``attempt(owner)`` instead of the state's acquire for the next first try.

        For callers that fold more work into the acquire's atomic step (the dispatcher records
        an event's dedupe claim in it: one round trip per fresh event). ``attempt`` answers like
        ``State.acquire``, or ``None`` to refuse: the lock is then not acquired and
        :attr:`refused` is set. Used once, and only if this acquisition does reach the server.
        ``now``: the same step without an await, used instead on the lean path.
        """
        self.first_attempt = attempt
        self.first_attempt_now = now

    # -- a lock acquired elsewhere --------------------------------------------------------------

    def hold_granted(self, owner: str, token: int, since: float) -> None:
        """Hold the lock the state handed to this task for ``owner`` at loop time ``since``
        (the inbox's hand-out), as if this object had acquired it then.

        ``async with self.holding()`` follows: it renews the lock on the schedule that began at
        ``since`` and releases it on exit (unless a step of the caller released it first).
        """
        self.check_idle()
        line, ticket = line_for(self.state, self.key), Ticket(owner, self.ttl)
        self.use_ticket(line, ticket)
        if line.member is None:
            line.hold(ticket, self.ttl, since)
        else:  # an acquirer of this process contends at the server: the release wakes it
            ticket.expires = since + self.ttl
        self.won(line, ticket, token, handed=True)
        self.held_since = since

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


def join_line(line: Line, ticket: Ticket) -> None:
    """Append ``ticket`` to ``line``'s waiters, with the future it is woken through."""
    ticket.future = asyncio.get_running_loop().create_future()
    line.join(ticket)


def left_to(holder: Ticket | None, now: float) -> float | None:
    """Seconds until ``holder``'s lock expires, if it holds one (``None``: unknown)."""
    if holder is None or math.isinf(holder.expires):
        return None
    return max(holder.expires - now, 0.0)
