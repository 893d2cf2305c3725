"""Two-phase dedupe claims: *in progress* under a renewed lease, then *done* for the full TTL.

``Deduper.claim`` and ``EventDispatcher`` record an event as in progress for a short lease and
mark it done only once it was handled: a worker that dies mid-event hides the platform's
redelivery for at most the lease, never for the whole dedupe TTL.

* :class:`LeaseKeeper` renews an in-progress record until the work ends.
* :class:`WaitingClaims`: the records of events that wait together (a ``latest`` backlog on
  MemoryState's lean path), one timer for all of them until a renewal is due.
* :class:`EventClaim` is one dispatch's claim on an event, moving through :class:`Phase`. It
  composes with the event's lock (its engine, ``asynclock._lock.engine.Engine``) only
  through the lock's two generic hooks (``arm_first_attempt`` and ``arm_release``): on a
  :class:`ClaimingState` the claim rides on the lock's acquire and release scripts (one round
  trip each); elsewhere it makes calls of its own. The lock knows nothing of dedupe.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, cast

from asynclock._errors import StateUnavailableError
from asynclock._timers import Timer, arm, call_later, disarm
from asynclock._validate import check_key

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock._events.event import Event
    from asynclock._lock.engine import Engine, ReleaseStep
    from asynclock._timers import Bucket
    from asynclock.state._protocol import ClaimingState, Grant, Release, State

logger = logging.getLogger("asynclock")


class LeaseKeeper:
    """Renews an *in progress* dedupe claim every ``lease/3`` seconds until :meth:`stop`.

    Lazy: nothing but a cheap timer (:mod:`asynclock._timers`) exists until the first renewal
    is due, so work shorter than ``lease/3`` costs no task and no round trip. Invariant: once
    :meth:`stop` has returned, no renewal is on the wire and none will be sent, so the caller's
    next write to the record (*done* with the full TTL, or forget) is the last one; a renewal
    is never cancelled mid-flight, because it could then land after that write and undo it.
    """

    __slots__ = ("_handle", "_lease", "_renewing", "_state", "_stopped", "_task", "key")

    def __init__(self, state: State, key: str, lease: float, *, due_now: bool = False) -> None:
        self._state = state
        self.key = key
        self._lease = lease
        self._task: asyncio.Task[None] | None = None
        self._renewing = False
        self._stopped = False
        self._handle: Timer | None = None
        if due_now:
            self._start()
        else:
            self._handle = call_later(lease / 3, self._start)

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
        if self._handle is not None:
            self._handle.cancel()
        task = self._task
        if task is None or task.done():
            return
        if not self._renewing:
            task.cancel()  # asleep between renewals: nothing on the wire
        await asyncio.wait({task})


class WaitingClaims:
    """In-progress claims of events that wait together, renewed by one timer, not one each.

    A :class:`LeaseKeeper` per waiting event costs a timer per event; a burst of events folded
    into one handler call (``latest``) is mostly waiting. Here a claim :meth:`add`-ed (just
    recorded, with a lease of ``lease`` seconds) costs a dict entry. The group's one timer is
    armed when its first claim comes in; when it fires (``lease/3`` later) every claim still in
    the group gets a keeper of its own, due at once (:meth:`EventClaim.keep`), and leaves it.

    Invariant: a claim added is renewed no later than ``lease/3`` after it was added, for as
    long as it is not :meth:`remove`-d; a claim that left the group is never touched by it.
    """

    __slots__ = ("_bucket", "_claims", "_lease", "_state", "callback", "due")

    _bucket: Bucket
    due: float
    callback: Callable[[], None]

    def __init__(self, state: State, lease: float) -> None:
        self._state = state
        self._lease = lease
        self._claims: dict[EventClaim, None] = {}

    def add(self, claim: EventClaim, loop: asyncio.AbstractEventLoop) -> None:
        """``claim`` was just recorded: renew it from ``lease/3`` on, until :meth:`remove`."""
        claims = self._claims
        if not claims:
            arm(self, self._lease / 3, self._due, loop)
        claims[claim] = None

    def remove(self, claim: EventClaim) -> None:
        """Stop renewing ``claim`` here (a keeper it was given goes on: see ``claim.keeping``)."""
        claims = self._claims
        if claim in claims:
            del claims[claim]
            if not claims:
                disarm(self)  # armed when the group filled, not fired since (that empties it)

    def _due(self) -> None:
        claims, self._claims = self._claims, {}
        for claim in claims:
            claim.keep(self._state, self._lease, due_now=True)


class Phase(enum.Enum):
    """Where one dispatch's claim on an event stands."""

    #: this dispatch has recorded nothing (or the record found is somebody else's)
    NEW = "new"
    #: recorded, or maybe recorded (an attempt of unknown outcome), by this dispatch; the lease
    #: is renewed while the event waits or runs
    IN_PROGRESS = "in progress"
    #: the handlers returned; the done mark is still to be written
    HANDLED = "handled"
    #: handled, and the done mark rode on the lock's release (or a lean step of its own)
    DONE_IN_RELEASE = "done in release"
    #: forgotten, so the platform's redelivery is processed
    FORGOTTEN = "forgotten"


# Enum members as module constants: each ``Phase.X`` is an enum descriptor lookup (0.2 µs, as
# much as the rest of a phase change), and a dispatch changes phases several times.
_NEW, _IN_PROGRESS, _HANDLED = Phase.NEW, Phase.IN_PROGRESS, Phase.HANDLED
_DONE_IN_RELEASE, _FORGOTTEN = Phase.DONE_IN_RELEASE, Phase.FORGOTTEN


class EventClaim:
    """One dispatch's claim on an event's dedupe record (see :class:`Phase`).

    Invariants: a claim is forgotten only if this dispatch may have recorded it (never another
    delivery's record); once :meth:`finish` or :meth:`forget` began, no lease renewal is on the
    wire any more, so their write is the record's last.
    """

    __slots__ = ("_keeper", "key", "owner", "phase")

    def __init__(self, key: str) -> None:
        self.key = key
        self.phase = _NEW
        #: the lock owner whose acquire_claimed recorded the claim as its own (ClaimingState)
        self.owner: str | None = None
        self._keeper: LeaseKeeper | None = None

    @classmethod
    def of(cls, event: Event, lock_key: str) -> EventClaim | None:
        """The claim of ``event`` serialized on ``lock_key``; ``None`` if it has no dedupe key."""
        dedupe_key = event.message_id or event.dedupe_key  # (the property's first answer)
        if dedupe_key is None:
            return None
        # refused like any key (NUL, lone surrogates), on every backend alike; the common
        # ASCII key without NUL is passed here, without the call
        if type(dedupe_key) is not str or not dedupe_key.isascii() or "\x00" in dedupe_key:
            check_key(dedupe_key, "event dedupe key")
        # under the lock key's hash tag, so claim and lock fit one Redis Cluster script
        return cls(f"event:{{{lock_key}}}:{event.adapter}:{dedupe_key}")

    @property
    def recorded(self) -> bool:
        """Whether this dispatch may have recorded the claim."""
        return self.phase not in (_NEW, _FORGOTTEN)

    @property
    def marked_done(self) -> bool:
        """Whether a step marked the claim done (see :meth:`done_in_step`; no renewal is left on
        the wire then)."""
        return self.phase is _DONE_IN_RELEASE

    @property
    def handled(self) -> bool:
        """Whether the event's handlers returned (a failure after that leaves it handled)."""
        return self.phase in (_HANDLED, _DONE_IN_RELEASE)

    def ride_on_acquire(self, lock: Engine, state: ClaimingState, lease: float) -> None:
        """Record the claim in ``lock``'s first server attempt, if it makes one (one round trip).

        If the claim exists already the attempt is refused (``lock.refused``): a duplicate,
        which :meth:`not_ours` then records.
        """
        key, ttl = lock.key, lock.ttl

        def claim_and_acquire(owner: str) -> Awaitable[Grant | None]:
            # from here the claim may be recorded as this owner's (even if the call fails):
            # forget it on failure if it is, preferring a possible second delivery to a loss
            self.phase = _IN_PROGRESS
            self.owner = owner
            return state.acquire_claimed(key, owner, ttl, claim=self.key, claim_ttl=lease)

        lean = lock.lean
        if lean is None:
            lock.arm_first_attempt(claim_and_acquire)
            return

        def claim_and_acquire_now(owner: str) -> Grant | None:
            self.phase = _IN_PROGRESS
            self.owner = owner
            return lean.acquire_claimed_now(key, owner, ttl, self.key, lease)

        lock.arm_first_attempt(claim_and_acquire, claim_and_acquire_now)

    def not_ours(self) -> None:
        """The record found belongs to another delivery: never forget or mark it."""
        self.phase = _NEW

    def keep(self, state: State, lease: float, *, due_now: bool = False) -> None:
        """The claim is recorded (in progress): renew its lease until the dispatch ends.

        ``due_now``: the first renewal is due now (the claim was recorded ``lease/3`` ago).
        """
        if self.phase is _NEW:
            self.phase = _IN_PROGRESS
        if self._keeper is None:
            self._keeper = LeaseKeeper(state, self.key, lease, due_now=due_now)

    def recorded_by(self, owner: str) -> None:
        """The lock step of ``owner`` recorded the claim (as :meth:`ride_on_acquire` would)."""
        self.phase = _IN_PROGRESS
        self.owner = owner

    def done_in_step(self) -> None:
        """Concluded (handled, or folded into a handler call), and the step that just went
        through marked the claim done: the lock's release, or a lean step of its own
        (MemoryState's fold path). Nothing is left to write."""
        self.phase = _DONE_IN_RELEASE

    def handled_now(self) -> None:
        """The event's handlers returned."""
        self.phase = _HANDLED

    async def settle_in_release(self, lock: Engine, state: ClaimingState, ttl: float) -> None:
        """Handled under ``lock``: mark the claim done (``ttl``) in the lock's release."""
        await self._stop_keeping()
        claim = self.key
        lean = lock.lean
        now = None
        if lean is not None:

            def now(
                key: str, owner: str, successor: str | None, successor_ttl: float | None
            ) -> Release:
                return lean.release_now(key, owner, claim, ttl, successor, successor_ttl)

        if lock.arm_release(self.release_step(state, ttl), now):
            self.phase = _DONE_IN_RELEASE

    def release_step(self, state: ClaimingState, ttl: float) -> ReleaseStep:
        """A lock release that marks this claim done (``ttl``) in the same step."""
        claim = self.key

        def release_claimed(
            key: str, owner: str, successor: str | None, successor_ttl: float | None
        ) -> Awaitable[Release]:
            return state.release_claimed(
                key, owner, claim=claim, claim_ttl=ttl, successor=successor, ttl=successor_ttl
            )

        return release_claimed

    def release_failed(self) -> None:
        """The lock's release failed after the handlers returned: the mark may not be written."""
        if self.phase is _DONE_IN_RELEASE:
            self.phase = _HANDLED

    async def _stop_keeping(self) -> None:
        if self._keeper is not None:
            await self._keeper.stop()

    @property
    def keeping(self) -> bool:
        """Whether a lease renewal was started (so the done mark must wait for :meth:`stop_keeping`)."""
        return self._keeper is not None

    async def stop_keeping(self) -> None:
        """Stop renewing the lease (none is on the wire once this returned); a later
        :meth:`keep` starts again."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            await keeper.stop()

    async def finish(self, state: State, ttl: float) -> bool:
        """Handled: remember the event for the full dedupe ``ttl``; ``False`` if that failed."""
        await self._stop_keeping()
        if not self.recorded or self.phase is _DONE_IN_RELEASE:
            return True
        try:
            await state.dedupe_keep(self.key, ttl)
        except StateUnavailableError as exc:
            # handled, but remembered only until the lease runs out unless a retry gets through
            # first: a later redelivery would run again (at least once, never lost)
            logger.warning(
                "asynclock: could not mark event claim %r done: %s; retrying in the background",
                self.key,
                exc,
            )
            return False
        return True

    async def forget(self, state: State) -> None:
        """Not handled (dropped, failed, cancelled): let the platform's redelivery through."""
        await self._stop_keeping()
        if not self.recorded:
            return
        self.phase = _FORGOTTEN
        try:
            if self.owner is not None:
                # only if it is ours: our claim attempt may not have landed, and the record may
                # be that of a delivery that was handled
                await cast("ClaimingState", state).forget_claimed(self.key, self.owner)
            else:
                await state.dedupe_forget(self.key)
        except StateUnavailableError as exc:
            logger.warning(
                "asynclock: could not forget event claim %r: a redelivery looks like a duplicate "
                "until its lease runs out (%s)",
                self.key,
                exc,
            )
