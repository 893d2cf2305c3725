"""The fast route's hold of a key: one record per event instead of a lock's machinery.

A :class:`LeanHold` is all that exists of an event on the fast route (``fast_route.py``) while
it holds or waits for its key: its ticket in the key's line and one cheap timer (the hold is its
own timer entry). It is granted by one step of the state's :class:`ImmediateSteps` and released
by one more, which marks the claim done and hands the lock to the next waiter of this process's
line if there is one, as every release does.

Queued (policy ``queue`` without a ``queue_timeout``, a key busy in this loop), the hold takes
its place at the end of the key's line on arrival, records its claim in one step (a duplicate is
answered at once), and waits on a bare future (:meth:`LeanHold.queue`): no Acquisition, no loop
timer of its own, the hold itself the timer that renews the claim's lease from ``lock_ttl / 3``
on. The holder's release hands the lock over in its own step; the woken event then runs as a
fresh one would, its lease timer becoming the lock's renewal timer.

What only a long handler needs is made when the timer fires at ``lock_ttl / 3``: the lock's
engine, an :class:`~asynclock._lock.acquisition.Acquisition`, that takes the acquisition over
(:meth:`~asynclock._lock.acquisition.Acquisition.adopt_held`: it renews the lock from then on,
cancels the body if the lock is lost, and releases it on the way out exactly as ``async with``
does) and the claim's lease renewal. From that moment on the event is where the
general path would have it, so every guarantee is the general path's.

Invariants: a queued hold that leaves (cancelled) passes on a lock handed to it meanwhile, at
once, so the key is never left to a task that is gone.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, cast

from asynclock import metrics as _metrics
from asynclock._cancel import BodyCanceller, body_entered
from asynclock._errors import LockLostError
from asynclock._lock.acquisition import Acquisition
from asynclock._lock.engine import Ticket, release_now
from asynclock._timers import arm, disarm
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from collections.abc import Callable

    from asynclock._dedupe.claim import EventClaim
    from asynclock._lock.engine import Line
    from asynclock._timers import Bucket
    from asynclock.state._immediate import ImmediateSteps
    from asynclock.state._protocol import ClaimingState, Release, State

logger = logging.getLogger("asynclock")


class LeanHold(Ticket):
    """One event's hold of its key on the lean path: its ticket in the key's line, from the
    place taken on arrival through the grant (:meth:`held`) to the release."""

    # the hold is its own timer entry (fires ``_due``), so an event arms no Timer object
    __slots__ = (
        "_bucket",
        "_claim",
        "_entered",
        "_leasing",
        "_line",
        "_state",
        "_steps",
        "callback",
        "due",
        "lock",
        "token",
    )

    swept = False  # a lock handed over to it is released or renewed by the lean path itself
    _bucket: Bucket
    due: float
    callback: Callable[[], None]

    def __init__(
        self, state: State, steps: ImmediateSteps, line: Line, owner: str, ttl: float
    ) -> None:
        # Ticket.__init__, inline (one per event)
        self.owner = owner
        self.ttl = ttl
        self.release_with = None
        self.release_now = None
        self.asked_at = 0.0
        self.future = None
        self.expires = math.inf
        self._state = state
        self._steps = steps  # the state's, without an await
        self._line = line
        self.token = 0
        self._claim: EventClaim | None = None
        self._leasing = False  # armed (as a timer entry) to renew a queued event's claim
        #: the lock's engine that took the acquisition over, once the first renewal was due
        self.lock: Acquisition | None = None

    def held(
        self,
        token: int,
        claim: EventClaim | None,
        task: asyncio.Task[object],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """The lock was granted (``token``), to be renewed from ``lock_ttl / 3`` on."""
        self.token = token
        self._claim = claim
        self.expires = self.asked_at + self.ttl  # as Line.hold: never later than the state's
        self._entered = body_entered(task)  # for the BodyCanceller, made only when due
        if self._leasing:
            # a queued event's lease timer, armed on arrival, becomes the renewal timer: due
            # earlier than the lock needs (harmless), when the claim's lease needs it anyway
            self._leasing = False
            self.callback = self._due
        else:
            arm(self, self.ttl / 3, self._due, loop)

    def queue(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[int | None]:
        """Wait in the key's line behind its member: the lean queued path (policy ``queue``).

        The place is taken now, on arrival, at the end of the line (FIFO with every other waiter
        of this loop, lean or not). Awaiting the returned future is the wait: no Acquisition and
        no loop timer of its own (the member of this loop always hands the lock over or passes
        its turn on when it releases, so no expiry needs watching). The future resolves to the
        handed-over token, or to ``None``: the event is the member now and must contend.
        """
        future: asyncio.Future[int | None] = loop.create_future()
        self.future = future
        self._line.join(self)
        return future

    def arrive(
        self, loop: asyncio.AbstractEventLoop, claim: EventClaim | None
    ) -> asyncio.Future[int | None] | None:
        """The queued path's arrival: the place taken (:meth:`queue`), the claim recorded in
        one step. Returns the future to await for the turn (then :meth:`handed`; on any error
        of that await, :meth:`left_queue`), or ``None`` for a duplicate (the place given up).

        Not a coroutine: the caller awaits the future itself, one frame less at every
        resumption of a queued event (and one coroutine less to make per event).
        """
        turn = self.queue(loop)  # the event's place in the key's line, taken on arrival
        if claim is None:
            return turn
        try:
            # recorded now, on arrival, as the general path records a waiter's claim: a
            # redelivery meanwhile (another dispatcher, another loop) is a duplicate
            fresh = self._steps.claim_now(claim.key, self.owner, self.ttl)
            if fresh:
                claim.recorded_by(self.owner)
                self.lease_while_queued(claim, loop)
        except BaseException:
            self.left_queue()
            raise
        if not fresh:
            self.left_queue()
            return None
        return turn

    def lease_while_queued(self, claim: EventClaim, loop: asyncio.AbstractEventLoop) -> None:
        """The queued event's claim is recorded: renew its lease from ``lock_ttl / 3`` on, for
        as long as the event waits (the hold is that timer; a LeaseKeeper only once it fires)."""
        self._claim = claim
        self._leasing = True
        arm(self, self.ttl / 3, self._lease_due, loop)

    def _lease_due(self) -> None:
        self._leasing = False
        assert self._claim is not None
        self._claim.keep(self._state, self.ttl, due_now=True)

    def _stop_lease_timer(self) -> None:
        if self._leasing:
            self._leasing = False
            disarm(self)

    def handed(self) -> int | None:
        """After the wait: the token handed over (the line's bookkeeping was done by the
        releaser), or ``None``: promoted to contend, the ticket now the member without a lock."""
        future = self.future
        assert future is not None
        self.future = None
        token = future.result()
        if token is None:
            self._stop_lease_timer()
        else:
            self.asked_at = self.expires - self.ttl  # the releaser timed the handoff (Line.hold)
        return token

    def left_queue(self) -> None:
        """The queued event leaves (cancelled, or a duplicate): give its place up, passing on
        what it was just given.

        A lock handed over meanwhile is passed to the next waiter (or released) at once, without
        an await, so the key is never left to a task that is gone.
        """
        self._stop_lease_timer()
        future = self.future
        self.future = None
        if future is None or not future.done() or future.cancelled():
            if future is not None:
                future.cancel()
            self._line.drop_waiter(self)
        elif future.result() is None:  # promoted to contend, nothing on the state yet
            self._line.leave(self)
        else:
            self._release(None, 0.0)

    def _due(self) -> None:
        """A long handler: from now on the lock's engine renews the lock, and the claim's lease too."""
        lock = Acquisition(self._state, self._line.key, self.ttl, auto_renew=True)
        body = BodyCanceller(self._entered)
        lock.adopt_held(self._line, self, self.token, self.asked_at, body)
        self.lock = lock
        if self._claim is not None:
            self._claim.keep(self._state, self.ttl, due_now=True)

    async def failed(self, error: BaseException) -> None:
        """The handlers raised ``error``: release the lock (the caller forgets the claim)."""
        if self.lock is not None:
            await self.lock.exit(type(error), error)
            return
        disarm(self)
        if not self._release(None, 0.0).owned:
            logger.warning(
                "asynclock: lock %r had expired before its body finished",
                self._line.key,
                extra={"lock_key": self._line.key, "owner": self.owner},
            )

    def handled_at_once(self, done_ttl: float) -> bool:
        """The handlers returned: release the lock now (or hand it to the next waiter), marking
        the claim done in the same step; ``False`` when the lock's engine took the acquisition over
        (a long handler): then :meth:`handled` is to be awaited instead.

        Raises:
            LockLostError: the lock had expired before the release (the claim is then still
                to be marked done by a call of its own).
        """
        claim = self._claim
        if self.lock is not None or (claim is not None and claim.keeping):
            return False
        disarm(self)
        if not self._release(claim, done_ttl).owned:
            raise LockLostError(self._line.key, self.owner)
        if claim is not None:
            claim.done_in_step()
        return True

    async def handled(self, done_ttl: float) -> None:
        """:meth:`handled_at_once` for an acquisition the lock's engine took over, or whose claim's
        lease was renewed while it waited in line."""
        lock, claim = self.lock, self._claim
        if lock is None:
            assert claim is not None
            disarm(self)  # the release follows the lease's stop at once: no renewal is due
            await claim.stop_keeping()
            if not self._release(claim, done_ttl).owned:
                raise LockLostError(self._line.key, self.owner)
            claim.done_in_step()
            return
        assert lock is not None
        if claim is not None:
            # (a state with immediate steps claims and locks in one step: MemoryState)
            claiming = cast("ClaimingState", self._state)
            await claim.settle_in_release(lock, claiming, done_ttl)
        await lock.exit(None, None)

    def _release(self, claim: EventClaim | None, claim_ttl: float) -> Release:
        claim_key = claim.key if claim is not None else None
        line = self._line
        if line.waiters or self.release_now is not None or line.member is not self:
            result = release_now(self._steps, line, self, claim_key, claim_ttl)
        else:  # release_now's common case, inline: nobody to hand over to
            self.release_with = None
            result = self._steps.release_now(line.key, self.owner, claim_key, claim_ttl)
            line.promote()
        if active.sink is not None:
            held = asyncio.get_running_loop().time() - self.asked_at
            _metrics.report("lock_released", self._line.key, held)
        return result
