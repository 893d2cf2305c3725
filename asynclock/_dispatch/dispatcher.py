"""EventDispatcher: events in, handlers out, one handler per lock key at a time, no silent loss.

Size: over 500 lines because the class carries the whole public surface of the dispatcher
(``dispatch``, ``submit``, ``accept``, ``serve``, ``aclose``) and its outcome rules; its parts
live beside it: the claim in ``_dedupe/claim.py``, handlers in ``_events/handlers.py``, latest/debounce
batches in ``_events/folding.py``, the inbox's drain loop in ``_inbox/drainer.py``, the lean path on MemoryState
(fresh and queued events) in ``_dispatch/fast_route.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import sys
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Literal, TypeVar, cast, final

from asynclock import metrics as _metrics
from asynclock._cancel import finish_despite_cancellation
from asynclock._dedupe.claim import EventClaim, WaitingClaims
from asynclock._dispatch.delivery import Delivery
from asynclock._dispatch.fast_route import LeanHold
from asynclock._dispatch.freeing import FreeingEstimate
from asynclock._errors import InboxFullError, StateUnavailableError
from asynclock._events.codec import encode
from asynclock._events.event import Event, HandlerContext, Outcome
from asynclock._events.folding import Backlog, BatchCall, Waiting, conclude, fold, settle
from asynclock._events.handlers import Handler, HandlerTable, Registered, call_all, resume
from asynclock._inbox.drainer import MAX_KEYS, Drainer
from asynclock._inbox.fold import FoldingDrain
from asynclock._inbox.retry import retry_plan
from asynclock._lock.acquisition import Acquisition
from asynclock._lock.grant import granted_reason
from asynclock._lock.lock import AsyncLock
from asynclock._lock.place import Place
from asynclock._lock.waiters import line_for
from asynclock._owner import new_owner
from asynclock._retry.slots import RetrySlots
from asynclock._supersede.inbox import SupersedingDrain, signal_holder
from asynclock._supersede.line import SupersedeLine
from asynclock._supersede.line import Waiting as Superseding
from asynclock._supersede.line import drain as drain_superseding
from asynclock._validate import check_key, check_seconds, check_ttl
from asynclock.metrics._active import active
from asynclock.state._immediate import ImmediateSteps, immediate_steps
from asynclock.state._protocol import (
    ClaimingState,
    DedupeReading,
    DurabilityCheck,
    InboxState,
    State,
)

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

    from asynclock._inbox.retry import PoisonPolicy
    from asynclock._lock.waiters import Line


logger = logging.getLogger("asynclock")

PolicyName = Literal["drop", "force", "queue", "latest", "debounce", "concurrent"]
POLICIES: tuple[PolicyName, ...] = ("drop", "force", "queue", "latest", "debounce", "concurrent")
#: a dispatcher-wide policy only (not one a policy function may pick per conflict: the holder
#: must have subscribed to the key's supersede signals before it took the lock)
SUPERSEDE: Literal["supersede"] = "supersede"
#: a policy name, or a (sync or async) function of (thread_key, event) returning one, per conflict
ConflictPolicy = (
    PolicyName | Literal["supersede"] | Callable[[str, Event], "PolicyName | Awaitable[PolicyName]"]
)
LockScope = Literal["thread", "channel"] | Callable[[Event], str]
OutcomeHook = Callable[[Event, Outcome, "BaseException | None"], "object | Awaitable[object]"]
H = TypeVar("H")

#: the context passed to handlers that take none (``(event)`` only): never read
_NONE = HandlerContext("")

_LEVELS = {
    Outcome.HANDLED: logging.INFO,
    Outcome.DUPLICATE: logging.INFO,
    Outcome.QUEUED: logging.INFO,
    Outcome.SKIPPED: logging.INFO,
    Outcome.FORCED: logging.WARNING,
    Outcome.DROPPED: logging.WARNING,
    Outcome.FAILED: logging.ERROR,
    Outcome.ACCEPTED: logging.INFO,
    Outcome.SUPERSEDED: logging.INFO,
}


# Enum members on the hot path as module constants: each ``Outcome.X`` is an enum descriptor
# lookup (0.2 µs), several per dispatched event.
_HANDLED, _DUPLICATE, _DROPPED = Outcome.HANDLED, Outcome.DUPLICATE, Outcome.DROPPED


@final
class EventDispatcher:
    """Routes events to handlers, one handler per lock key at a time, across processes.

    Per event, in order:

    1. **Dedupe** (when the event has a ``dedupe_key``): a redelivered event returns
       ``DUPLICATE`` before anything is locked.
    2. **Lock** the event's key (``lock_scope``) without waiting. If that works, the handlers
       run under the lock, which is renewed every ``lock_ttl/3`` while they run; a lost lock
       cancels them and the event is ``FAILED`` with :class:`LockLostError`.
    3. **Conflict**: the key is busy; ``on_lock_conflict`` decides (see the table in the docs):
       ``drop``, ``force``, ``queue``, ``latest``, ``debounce``, ``concurrent``, or a function
       ``(thread_key, event) -> name`` asked per conflict.

    Invariants:

    * At most one handler runs per lock key at any time, across every process sharing the
      state (except ``force``/``concurrent``, which run without the lock, by request).
    * No event disappears silently: every outcome is logged on the ``asynclock`` logger with
      the event's keys, counted in :attr:`stats` and passed to ``on_outcome``. An event that
      is not handled (dropped, failed, cancelled) has its dedupe record forgotten, so the
      platform's redelivery is processed.
    * ``queue``: events of one key wait in arrival order within a process; nothing is dropped.

    Args:
        state: where locks and dedupe records live, required: :class:`MemoryState` for one
            process, a server state shared by every worker otherwise.
        on_lock_conflict: the conflict policy (default ``"drop"``).
        lock_ttl: seconds of each lock between renewals (renewed every ``lock_ttl/3``).
        dedupe_ttl: seconds an event id is remembered.
        lock_scope: ``"thread"`` (``adapter:channel:thread``), ``"channel"`` or a function
            ``event -> key``.
        debounce: seconds without a new event that ``debounce`` waits for (in :meth:`serve`,
            at most ``max(debounce, lock_ttl / 3)`` per batch, so a steady stream cannot
            starve a key).
        raise_errors: re-raise a handler's exception from :meth:`dispatch` (the outcome is
            still recorded as ``FAILED`` first).
        on_outcome: called as ``on_outcome(event, outcome, error)`` after every dispatch (sync
            or async), for metrics exporters; its own errors are logged and swallowed.
        queue_timeout: seconds a ``queue``d event waits at most before it is ``DROPPED``
            (default: no limit).
        max_attempts: deliveries of an inbox entry whose handler keeps failing before it is
            dead-lettered (:meth:`serve`).
        max_pending: undrained inbox entries per key beyond which :meth:`accept` raises
            :class:`InboxFullError`.
        retry_wait: how long an inbox entry whose handler failed waits before its next
            delivery (:meth:`serve`): seconds (plus up to 15 % at random) or a function
            ``attempt -> seconds`` (``attempt`` is the delivery that failed, 1 for the first),
            the forms of ``retry_on_lock_conflict``'s ``wait``. It waits in the state, holding
            no lock and no worker; the key's later entries wait behind it. ``None`` (default)
            and waits under a millisecond: a short backoff while the worker holds the key.
        on_poison: after ``max_attempts``: ``"dead_letter"`` (default) sets the entry aside
            and the key goes on; ``"park"`` stops the key at it (nothing is handed out until
            ``asynclock inbox requeue KEY`` or ``discard KEY``).

    Example:
        >>> import asyncio
        >>> from asynclock import EventDispatcher, Event
        >>> from asynclock import MemoryState
        >>> bot = EventDispatcher(MemoryState())
        >>> @bot.on("mention")
        ... async def reply(event: Event) -> None:
        ...     pass
        >>> e = Event(type="mention", adapter="slack", channel_id="C1", thread_id="T1",
        ...           message_id="m1")
        >>> async def main():
        ...     return [await bot.dispatch(e), await bot.dispatch(e)]
        >>> print(*asyncio.run(main()))
        handled duplicate
    """

    __slots__ = (
        "_backlogs",
        "_checking",
        "_claiming",
        "_claims_here",
        "_closed",
        "_debounce",
        "_dedupe_ttl",
        "_done_ttl",
        "_durability",
        "_freeing",
        "_handlers",
        "_lean",
        "_lock_ttl",
        "_marking",
        "_max_attempts",
        "_max_pending",
        "_on_outcome",
        "_policy",
        "_queue_timeout",
        "_raise_errors",
        "_retry",
        "_scope",
        "_slots",
        "_state",
        "_stats",
        "_stopping",
        "_supersede_grace",
        "_supersede_lines",
        "_tasks",
    )

    def __init__(
        self,
        state: State,
        *,
        on_lock_conflict: ConflictPolicy = "drop",
        lock_ttl: float = 30.0,
        dedupe_ttl: float = 600.0,
        lock_scope: LockScope = "thread",
        debounce: float = 1.5,
        raise_errors: bool = True,
        on_outcome: OutcomeHook | None = None,
        queue_timeout: float | None = None,
        max_attempts: int = 5,
        max_pending: int = 1000,
        retry_wait: float | Callable[[int], float] | None = None,
        on_poison: PoisonPolicy = "dead_letter",
        supersede_grace: float | None = 0.0,
    ) -> None:
        if (
            not callable(on_lock_conflict)
            and on_lock_conflict not in POLICIES
            and on_lock_conflict != SUPERSEDE
        ):
            raise ValueError(
                f"on_lock_conflict must be one of {', '.join((*POLICIES, SUPERSEDE))} or a "
                f"function (thread_key, event) -> name, got {on_lock_conflict!r}"
            )
        if not callable(lock_scope) and lock_scope not in ("thread", "channel"):
            raise ValueError(
                f"lock_scope must be 'thread', 'channel' or a function event -> key, "
                f"got {lock_scope!r}"
            )
        if on_outcome is not None and not callable(on_outcome):
            raise TypeError(f"on_outcome must be callable, got {on_outcome!r}")
        if state is None or not isinstance(state, State):
            # no silent per-process default: workers that forget state= would dedupe and lock
            # nothing across processes
            raise TypeError(
                f"EventDispatcher needs a state, got {state!r}: pass MemoryState() for one "
                "process, or a server state (RedisState, PostgresState, MySQLState) that every "
                "worker shares"
            )
        self._state: State = state
        self._policy = on_lock_conflict
        self._lock_ttl = check_ttl(lock_ttl, "lock_ttl")
        self._dedupe_ttl = check_ttl(dedupe_ttl, "dedupe_ttl")
        # a done record outlives every lease (at most lock_ttl) for the whole dedupe_ttl, so its
        # remaining time alone tells it from an in-progress claim (see deliver())
        self._done_ttl = self._dedupe_ttl + self._lock_ttl
        self._freeing = FreeingEstimate()
        self._slots = RetrySlots(state)
        #: the state's steps, if they need no await (MemoryState): the lean path (``_dispatch/fast_route.py``)
        self._lean = immediate_steps(state)
        #: the state as a ClaimingState, if it is one
        self._claiming = state if isinstance(state, ClaimingState) else None
        #: the state as a DurabilityCheck until its check settled (None while one runs)
        self._durability = state if isinstance(state, DurabilityCheck) else None
        self._checking: asyncio.Task[None] | None = None
        self._scope = lock_scope
        debounce_seconds = check_seconds(debounce, "debounce", allow_zero=True)
        assert debounce_seconds is not None
        self._debounce = debounce_seconds
        self._queue_timeout = check_seconds(queue_timeout, "queue_timeout", allow_none=True)
        self._max_attempts = _check_count(max_attempts, "max_attempts")
        self._max_pending = _check_count(max_pending, "max_pending")
        self._retry = retry_plan(retry_wait, on_poison)
        if on_lock_conflict == SUPERSEDE and (retry_wait is not None or on_poison != "dead_letter"):
            # a superseding drain retries and dead-letters by its own rules (an interruption is
            # not a failure): refused rather than silently ignored
            raise ValueError(
                f"retry_wait and on_poison='park' do not apply with on_lock_conflict='supersede' "
                f"(got retry_wait={retry_wait!r}, on_poison={on_poison!r})"
            )
        self._supersede_grace = check_seconds(
            supersede_grace, "supersede_grace", allow_zero=True, allow_none=True
        )
        #: supersede: the events and running call of each key, in this process
        self._supersede_lines: dict[str, SupersedeLine] = {}
        self._stopping: set[asyncio.Event] = set()
        self._raise_errors = bool(raise_errors)
        self._on_outcome = on_outcome
        self._handlers = HandlerTable()
        self._stats: dict[Outcome, int] = dict.fromkeys(Outcome, 0)
        self._tasks: set[asyncio.Task[object]] = set()
        self._marking: set[asyncio.Task[None]] = set()
        self._backlogs: dict[str, Backlog] = {}
        #: claim keys of the dispatches running in this process now
        self._claims_here: set[str] = set()
        self._closed = False

    def __repr__(self) -> str:
        policy = self._policy if isinstance(self._policy, str) else _name(self._policy)
        return (
            f"<EventDispatcher on_lock_conflict={policy} lock_ttl={self._lock_ttl} "
            f"in_flight={len(self._tasks)} state={self._state!r}>"
        )

    # -- registration -------------------------------------------------------------------------

    def on(self, event_type: str) -> Callable[[H], H]:
        """Register the decorated function as a handler of ``event_type`` (``"*"``: every type).

        A handler is ``async def handler(event)`` or ``async def handler(event, ctx)``; plain
        functions work too. Several handlers of one event run one after the other, in
        registration order, specific types before ``"*"``.
        """
        check_key(event_type, "event_type")

        def register(function: H) -> H:
            self.add_handler(event_type, cast("Handler", function))
            return function

        return register

    def add_handler(self, event_type: str, handler: Handler) -> None:
        """Register ``handler`` for ``event_type`` (the non-decorator form of :meth:`on`)."""
        self._handlers.add(event_type, handler)

    # -- observability ------------------------------------------------------------------------

    @property
    def stats(self) -> Mapping[Outcome, int]:
        """Outcome -> how many dispatches ended with it (a live, read-only view)."""
        return types.MappingProxyType(self._stats)

    @property
    def on_lock_conflict(self) -> ConflictPolicy:
        """The conflict policy, as given (a name, or the function asked per conflict)."""
        return self._policy

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (``submit`` then raises ``RuntimeError``)."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Dispatches submitted or backlog drainers still running (for health checks)."""
        return len(self._tasks)

    @property
    def state(self) -> State:
        """The state the dispatcher's locks and dedupe records live in."""
        return self._state

    async def _record(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Outcome:
        self._count(event, outcome, lock_key, error, started)
        hook = self._on_outcome
        if hook is not None:
            try:
                result = hook(event, outcome, error)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("asynclock: the on_outcome hook failed")
        return outcome

    def _count(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Outcome:
        """:meth:`_record` but the ``on_outcome`` hook (all of it, without one): count and log."""
        self._stats[outcome] += 1
        if active.sink is not None and started is not None:
            duration = asyncio.get_running_loop().time() - started
            _metrics.report("dispatch_outcome", event.type, outcome.value, duration)
        level = _LEVELS[outcome]
        if logger.isEnabledFor(level):  # the record's fields cost more than the rest of _record
            self._log(event, outcome, lock_key, level, error)
        return outcome

    @staticmethod
    def _log(
        event: Event, outcome: Outcome, lock_key: str, level: int, error: BaseException | None
    ) -> None:
        logger.log(
            level,
            "asynclock: event %s %s/%s/%s message=%s -> %s%s",
            event.type,
            event.adapter,
            event.channel_id,
            event.thread_id,
            event.message_id,
            outcome.value,
            f" ({type(error).__name__}: {error})" if error is not None else "",
            exc_info=error if outcome is Outcome.FAILED else None,
            extra={
                "event_type": event.type,
                "adapter": event.adapter,
                "channel_id": event.channel_id,
                "thread_id": event.thread_id,
                "message_id": event.message_id,
                "dedupe_key": event.dedupe_key,
                "lock_key": lock_key,
                "outcome": outcome.value,
            },
        )

    # -- dispatch -----------------------------------------------------------------------------

    def lock_key(self, event: Event) -> str:
        """The key ``event`` is serialized on, per ``lock_scope``."""
        scope = self._scope
        if scope == "thread":
            return event.thread_key
        if scope == "channel":
            return event.channel_key
        assert callable(scope)
        return check_key(scope(event), "lock_scope(event)")

    async def dispatch(self, event: Event) -> Outcome:
        """Dedupe, lock and handle ``event``; return what happened.

        Raises:
            Exception: a handler's exception, when ``raise_errors`` (after recording FAILED).
            StateUnavailableError: the state could not be reached (recorded as FAILED too).
        """
        if not isinstance(event, Event):
            raise TypeError(f"dispatch() takes an Event, got {type(event).__name__}")
        return await self._dispatch_event(event, submitted=False)

    async def deliver(self, event: Event) -> Delivery:
        """:meth:`dispatch` ``event`` as one webhook delivery; say what the platform must be told.

        The outcome is :meth:`dispatch`'s. Beyond it: a ``DUPLICATE`` whose first delivery is
        still *in progress* (its claim leased, not marked done: maybe by a worker that died) is
        ``in_progress``, with ``retry_after`` the seconds until that lease lapses, so the
        platform's redelivery then runs the event if nobody finished it; a ``DROPPED`` event's
        ``retry_after`` estimates when its key frees (see :class:`FreeingEstimate`). Telling an
        in-progress duplicate from a done one costs one read, on duplicates only, and needs a
        :class:`~asynclock.state.DedupeReading` state (every shipped one); on another state a
        duplicate counts as done, as :meth:`dispatch` reports it.

        Raises:
            Exception: as :meth:`dispatch`.
        """
        if not isinstance(event, Event):
            raise TypeError(f"deliver() takes an Event, got {type(event).__name__}")
        outcome = await self._dispatch_event(event, submitted=False)
        if outcome is _DROPPED:
            return Delivery(outcome, retry_after=await self._promise_retry(self.lock_key(event)))
        if outcome is not _DUPLICATE or not isinstance(self._state, DedupeReading):
            return Delivery(outcome)
        lock_key = self.lock_key(event)
        claim = EventClaim.of(event, lock_key)
        if claim is None:  # not deduped: a DUPLICATE cannot come from a record
            return Delivery(outcome)
        remaining = await self._state.dedupe_remaining(claim.key)
        if remaining is None:  # forgotten (not handled) or lapsed since: redeliver when it frees
            retry_after = await self._promise_retry(lock_key)
            return Delivery(outcome, in_progress=True, retry_after=retry_after)
        if remaining > self._lock_ttl:
            return Delivery(outcome)  # done: only a done record outlives a lease
        # just past the lapse, so the redelivery finds the claim gone; jittered, so the retries
        # of one burst do not land together
        return Delivery(outcome, in_progress=True, retry_after=remaining + _jitter())

    def _retry_after(self, lock_key: str) -> float:
        return self._freeing.retry_after(lock_key, cap=self._lock_ttl)

    async def _promise_retry(self, lock_key: str) -> float:
        """When a retry on busy ``lock_key`` should come: this process's estimate, made a slot
        that no other worker promises (claimed in the state) when one is free within the cap."""
        estimate = self._retry_after(lock_key)
        claimed = await self._slots.claim(lock_key, estimate, cap=self._lock_ttl)
        if claimed is None:
            return estimate
        self._freeing.promised(lock_key, claimed)
        return claimed

    def _note_holder(self, lock_key: str, left: float | None) -> None:
        """The busy key's holder has ``left`` seconds on its lock (``None``: unknown)."""
        # a live holder renews every lock_ttl/3, so it never has under 2/3 of it left for long:
        # less than half means it stopped (killed, stuck), and the key frees only at the lapse
        if left is not None and left < self._lock_ttl / 2:
            self._freeing.stalled(lock_key, left)

    async def _dispatch_event(self, event: Event, *, submitted: bool) -> Outcome:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            lock_key = self.lock_key(event)
        except Exception as error:  # a lock_scope function failed: still logged and counted
            await self._record(event, Outcome.FAILED, "<lock_scope failed>", error, started)
            if self._raise_errors:
                raise
            return Outcome.FAILED
        claim = EventClaim.of(event, lock_key)
        if claim is not None:
            if claim.key in self._claims_here:
                # another delivery of this event is being dispatched in this process: its claim
                # is recorded or on its way. Deciding here, before the state is asked, keeps the
                # first delivery the one that is handled, in its place in the key's line
                await asyncio.sleep(0)
                return await self._record(event, _DUPLICATE, lock_key, started=started)
            self._claims_here.add(claim.key)
        try:
            try:
                outcome = await self._choose_route(
                    event, lock_key, claim, loop, submitted=submitted
                )
            except asyncio.CancelledError:
                if claim is not None:  # handled: keep it; not handled: let a redelivery through
                    await finish_despite_cancellation(
                        self._finish(claim) if claim.handled else claim.forget(self._state)
                    )
                raise
            except Exception as error:
                if claim is not None:
                    await finish_despite_cancellation(claim.forget(self._state))
                await self._record(event, Outcome.FAILED, lock_key, error, started)
                if self._raise_errors:
                    raise
                return Outcome.FAILED
            if claim is not None:
                if outcome is _DROPPED:
                    await claim.forget(self._state)
                elif not claim.marked_done:
                    await self._finish(claim)
            if self._on_outcome is None:  # nothing to await: no coroutine for the record
                return self._count(event, outcome, lock_key, started=started)
            return await self._record(event, outcome, lock_key, started=started)
        finally:
            if claim is not None:
                self._claims_here.discard(claim.key)

    def _choose_route(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
        *,
        submitted: bool,
    ) -> Awaitable[Outcome]:
        """The lean path (``_dispatch/fast_route.py``) when it may serve ``event``, else :meth:`_route`."""
        if self._policy == SUPERSEDE:
            return self._supersede(event, lock_key, claim, loop)
        lean = self._lean
        if (
            lean is not None
            and self._policy != "concurrent"
            and granted_reason() is None
            and lean.steps_are_own()
        ):
            line = line_for(self._state, check_key(lock_key), loop)
            if line.member is None:
                if not line.waiters:
                    return self._route_lean(
                        lean, line, event, lock_key, claim, loop, submitted=submitted
                    )
            elif self._policy == "queue" and self._queue_timeout is None:
                # busy in this loop: wait in its line, lean too (no timeout to time)
                return self._route_lean(
                    lean, line, event, lock_key, claim, loop, submitted=submitted, queued=True
                )
            elif self._policy == "latest" or self._policy == "debounce":
                # busy in this loop: the general path would not ask the state for the lock
                # either (the line's member is ahead), but join the backlog
                return self._fold_lean(lean, event, lock_key, claim, loop)
        return self._route(event, lock_key, claim, submitted=submitted)

    async def _route(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        *,
        submitted: bool,
        placed: Place | None = None,
    ) -> Outcome:
        """Lock and handle ``event``, or apply the conflict policy; ``placed``: a lock whose
        place in the key's line was taken already (handed over by the lean path)."""
        handlers = self._handlers.for_type(event.type)
        if self._policy == "concurrent" or granted_reason() is not None:
            # no lock to take (concurrent), or every AsyncLock is granted without touching the
            # state (inside process_without_lock): the claim is recorded on its own
            if claim is not None and not await self._claim_alone(claim):
                return _DUPLICATE
            if self._policy == "concurrent":
                await call_all(handlers, event, HandlerContext(lock_key))
                return _HANDLED
            granted = Acquisition(self._state, check_key(lock_key), self._lock_ttl)
            await granted.acquire()
            await self._under_lock(granted, handlers, event, claim)
            return _HANDLED
        if placed is not None:
            lock = placed
        else:
            lock = Place(self._state, check_key(lock_key), self._lock_ttl, auto_renew=True)
            # the event's place among this process's events of the key is taken now, on
            # arrival: nothing awaited below lets a later event overtake it
            lock.take_place()
        try:
            if claim is not None:
                if self._claiming is not None:
                    # only the line's member asks the state now; a waiter's claim is recorded on
                    # its own below, so a waiter promoted later must not claim again with its lock
                    if lock.first_in_line() and not claim.recorded:
                        # (a lean queued event promoted to contend recorded its claim already)
                        claim.ride_on_acquire(lock, self._claiming, self._lock_ttl)
                elif not await self._claim_alone(claim):  # duplicates are found before locking
                    await lock.leave_place()
                    return _DUPLICATE
            acquired = await lock.try_from_place()
            if lock.refused:
                assert claim is not None
                claim.not_ours()
                return _DUPLICATE
            if claim is not None:
                # an event behind another of this process never reached the server: its claim
                # is recorded on its own
                if not claim.recorded and not await self._claim_alone(claim):
                    await lock.leave_place()
                    return _DUPLICATE
                claim.keep(self._state, self._lock_ttl)  # waits or runs under a policy from here
            if acquired:
                await self._under_lock(lock, handlers, event, claim)
                return _HANDLED
            policy = await self._conflict_policy(lock_key, event, submitted=submitted)
            if policy == "queue":
                loop = asyncio.get_running_loop()
                timeout = self._queue_timeout
                if not await lock.wait_turn(None if timeout is None else loop.time() + timeout):
                    return _DROPPED  # queue_timeout ran out
                await self._under_lock(lock, handlers, event, claim)
                return Outcome.QUEUED
            await lock.leave_place()
        except BaseException:
            await finish_despite_cancellation(lock.leave_place())
            raise
        if policy == "drop":
            self._note_holder(lock_key, lock.retry_after)
            return _DROPPED
        if policy in ("force", "concurrent"):
            await call_all(handlers, event, HandlerContext(lock_key, forced=True))
            return Outcome.FORCED
        return await self._join_backlog(event, lock_key, debounce=policy == "debounce")

    async def _route_lean(
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
        """:meth:`_route` for a key nobody of this process is in line for, on MemoryState;
        ``queued``: for a key busy in this loop, under the ``queue`` policy (no timeout).

        One yield, one step to claim the event and take the lock (a queued event: one step to
        record its claim, then its wait in the key's line, the yield, until the lock is handed
        over), the handlers,
        one step to release the lock and mark the claim done: see ``_dispatch/fast_route.py``.
        """
        ttl = self._lock_ttl
        task = asyncio.current_task(loop)
        if task is None:
            raise RuntimeError("dispatch() must run in an asyncio task")
        hold = LeanHold(self._state, lean, line, new_owner(task), ttl)
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
            placed = Place(self._state, lock_key, ttl, auto_renew=True)
            placed.adopt_place(line, hold)
            outcome = await self._route(event, lock_key, claim, submitted=submitted, placed=placed)
            return Outcome.QUEUED if queued and outcome is _HANDLED else outcome
        hold.held(token, claim, task, loop)
        if active.sink is not None:
            _metrics.report("lock_acquired", lock_key, loop.time() - arrived, queued)
        handlers, with_context = self._handlers.with_context(event.type)
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
                self._freeing.observe(lock_key, loop.time() - began)
                if claim is not None:
                    claim.handled_now()
            except BaseException as body_error:
                await hold.failed(body_error)
                raise
            if not hold.handled_at_once(self._done_ttl):
                await hold.handled(self._done_ttl)
        except Exception as error:
            if not handled:
                raise
            self._release_failed(event, lock_key, claim, error)
        except BaseException:
            if handled and claim is not None:
                claim.release_failed()
            raise
        return Outcome.QUEUED if queued else _HANDLED

    async def _fold_lean(
        self,
        lean: ImmediateSteps,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
    ) -> Outcome:
        """:meth:`_route` for a key busy in this loop under ``latest``/``debounce``, on
        MemoryState: one step records the claim (a duplicate is answered at once), the event
        joins the key's backlog, where its claim's lease is renewed with the backlog's
        (:class:`WaitingClaims`, no timer of its own), and one more step marks the claim done as
        its outcome comes back. The wait for the outcome is the dispatch's yield."""
        ttl = self._lock_ttl
        if claim is not None:
            owner = new_owner(asyncio.current_task(loop))
            if not lean.claim_now(claim.key, owner, ttl):
                await asyncio.sleep(0)  # the yield rule
                return _DUPLICATE
            claim.recorded_by(owner)
        backlog, outcome = self._backlog_entry(event, lock_key, self._policy == "debounce", loop)
        if claim is None:
            return await outcome
        claims = backlog.claims
        if claims is None:
            claims = backlog.claims = WaitingClaims(self._state, ttl)
        claims.add(claim, loop)
        try:
            concluded = await outcome
        finally:
            claims.remove(claim)
        if not claim.keeping:  # (else its keeper is stopped first, by the general finish)
            lean.keep_now(claim.key, self._done_ttl)
            claim.done_in_step()
        return concluded

    async def _claim_alone(self, claim: EventClaim) -> bool:
        """Record ``claim`` in progress by a call of its own; ``False``: it is a duplicate."""
        if not await self._state.dedupe_add(claim.key, self._lock_ttl):
            return False
        claim.keep(self._state, self._lock_ttl)
        return True

    async def _under_lock(
        self, lock: Acquisition, handlers: list[Registered], event: Event, claim: EventClaim | None
    ) -> None:
        """Run the handlers under ``lock`` (acquired or granted already), then release it.

        Once the handlers have returned, the event is handled, whatever the release then says:
        a release that fails (the state unreachable, the lock expired meanwhile) is logged, the
        lock expires by its TTL, and the claim is marked done by a call of its own. Reporting
        it failed would make the platform redeliver an event whose effects already happened.
        """
        handled = False
        # `async with lock.holding():` spelled out (lock.exit never swallows), which spares
        # the holding object and two coroutines per event
        lock.check_held()
        lock.start_holding()
        try:
            try:
                if claim is not None:
                    claim.keep(self._state, self._lock_ttl)
                loop = asyncio.get_running_loop()
                began = loop.time()
                await call_all(handlers, event, HandlerContext(lock.key, lock.token))
                handled = True
                self._freeing.observe(lock.key, loop.time() - began)
                if claim is not None:
                    claim.handled_now()
                    if self._claiming is not None:  # the release marks it done too
                        await claim.settle_in_release(lock, self._claiming, self._done_ttl)
            except BaseException as body_error:
                await lock.exit(type(body_error), body_error)
                raise
            await lock.exit(None, None)
        except Exception as error:
            if not handled:
                raise
            self._release_failed(event, lock.key, claim, error)
        except BaseException:
            if handled and claim is not None:
                claim.release_failed()
            raise

    @staticmethod
    def _release_failed(
        event: Event, lock_key: str, claim: EventClaim | None, error: Exception
    ) -> None:
        """The handlers returned, then the lock's release failed: the event stays handled."""
        if claim is not None:
            claim.release_failed()  # so the done mark is written by a call of its own
        logger.warning(
            "asynclock: event %s handled, but releasing lock %r failed (%s: %s); the lock "
            "expires by its TTL",
            event.message_id,
            lock_key,
            type(error).__name__,
            error,
            extra={"lock_key": lock_key, "message_id": event.message_id},
        )

    async def _conflict_policy(self, lock_key: str, event: Event, *, submitted: bool) -> PolicyName:
        policy = self._policy
        if isinstance(policy, str):
            assert policy != SUPERSEDE  # never asked: supersede routes apart (_supersede)
            return policy
        chosen = policy(lock_key, event)
        if inspect.isawaitable(chosen):
            chosen = await chosen
        if chosen not in POLICIES:
            raise ValueError(
                f"on_lock_conflict function {_name(policy)} returned {chosen!r} for "
                f"{lock_key!r}; expected one of {', '.join(POLICIES)}"
            )
        if chosen == "drop" and submitted:
            # the caller of submit() has answered already: a drop could not be redelivered
            logger.warning(
                "asynclock: on_lock_conflict function %s chose 'drop' for submitted event %s of "
                "%r; it is queued instead (a submitted event cannot be answered 'dropped')",
                _name(policy),
                event.message_id,
                lock_key,
                extra={"lock_key": lock_key, "message_id": event.message_id},
            )
            return "queue"
        return chosen

    async def _finish(self, claim: EventClaim) -> None:
        """Mark a handled event's claim done; if the state is out of reach, keep trying.

        The claim's lease is no longer renewed, so it lapses within ``lock_ttl``; a retry that
        gets through once the state is back (before a redelivery arrives) still saves that
        redelivery from running the handlers a second time.
        """
        if not await claim.finish(self._state, self._done_ttl):
            task = asyncio.get_running_loop().create_task(
                self._mark_done_later(claim.key), name=f"asynclock-mark-done {claim.key!r}"
            )
            self._marking.add(task)
            task.add_done_callback(self._marking.discard)

    async def _mark_done_later(self, key: str) -> None:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._dedupe_ttl  # the record would have expired by then
        delay = 0.05
        while loop.time() < give_up:
            await asyncio.sleep(delay)
            try:
                await self._state.dedupe_keep(key, self._done_ttl)
            except StateUnavailableError:
                delay = min(delay * 2, self._lock_ttl / 3)
                continue
            except Exception:  # the state was closed, say: nothing left to retry with
                logger.warning("asynclock: gave up marking event claim %r done", key, exc_info=True)
                return
            logger.info("asynclock: marked event claim %r done after a retry", key)
            return

    # -- supersede ----------------------------------------------------------------------------

    async def _supersede(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
    ) -> Outcome:
        """Join ``lock_key``'s supersede line (``_supersede/line.py``), interrupting its running
        call; the outcome comes once the call covering the event returned."""
        line = self._supersede_lines.get(lock_key)
        if line is None:
            line = self._supersede_lines[lock_key] = SupersedeLine()
        future: asyncio.Future[Outcome] = loop.create_future()
        waiting = Superseding(event, future)
        line.arrive(waiting)  # its place in the line (skipped order), taken on arrival
        try:
            duplicate = claim is not None and not await self._claim_alone(claim)
        except BaseException:
            self._leave_superseding(lock_key, line, waiting)
            raise
        if duplicate:
            self._leave_superseding(lock_key, line, waiting)
            return _DUPLICATE
        line.ready(waiting)
        if line.drainer is None:
            line.drainer = self._spawn(self._drain_superseding(lock_key, line), "supersede")
        return await future

    def _leave_superseding(self, lock_key: str, line: SupersedeLine, waiting: Superseding) -> None:
        """``waiting`` is not handled (a duplicate, its claim failed): its place goes, and the
        line too when nothing else is in it."""
        line.leave(waiting)
        if (
            line.drainer is None
            and not line.entries
            and not line.carried
            and self._supersede_lines.get(lock_key) is line
        ):
            del self._supersede_lines[lock_key]

    async def _drain_superseding(self, lock_key: str, line: SupersedeLine) -> None:
        try:
            await drain_superseding(
                self._state,
                lock_key,
                line,
                self._handlers,
                ttl=self._lock_ttl,
                grace=self._supersede_grace,
                carry_ttl=self._dedupe_ttl,
            )
        finally:
            line.drainer = None
            # nothing awaited between the drainer's last check and this: a later arrival
            # starts a new drainer
            if not line.entries and self._supersede_lines.get(lock_key) is line:
                del self._supersede_lines[lock_key]

    # -- latest / debounce --------------------------------------------------------------------

    async def _join_backlog(self, event: Event, lock_key: str, *, debounce: bool) -> Outcome:
        loop = asyncio.get_running_loop()
        return await self._backlog_entry(event, lock_key, debounce, loop)[1]

    def _backlog_entry(
        self, event: Event, lock_key: str, debounce: bool, loop: asyncio.AbstractEventLoop
    ) -> tuple[Backlog, asyncio.Future[Outcome]]:
        """Append ``event`` to ``lock_key``'s backlog (starting its drainer if none runs): the
        backlog, and the future of the event's outcome."""
        backlog = self._backlogs.get(lock_key)
        if backlog is None:
            backlog = self._backlogs[lock_key] = Backlog(debounce)
        future: asyncio.Future[Outcome] = loop.create_future()
        backlog.entries.append((event, future))
        backlog.last_arrival = loop.time()
        if backlog.drainer is None:
            backlog.drainer = self._spawn(self._drain(lock_key, backlog), f"drain {lock_key!r}")
        return backlog, future

    async def _drain(self, lock_key: str, backlog: Backlog) -> None:
        """Serve a backlog: take the lock, handle each thread's newest event, the rest skipped.

        The backlog stays registered until a check that finds nobody waiting, and nothing is
        awaited between that check and unregistering it: an event that joins while a round ends
        (the lock being released) is served by the next round, never stranded.
        """
        loop = asyncio.get_running_loop()
        batch: list[Waiting] = []
        calls: list[BatchCall] = []
        try:
            while any(not future.done() for _, future in backlog.entries):
                lock = AsyncLock(self._state, lock_key, self._lock_ttl, auto_renew=True)
                async with lock:
                    # debounce: hold the key until no new event arrived for `debounce` seconds
                    while (  # noqa: ASYNC110 - a timer that each new arrival pushes back
                        backlog.debounce
                        and (quiet := backlog.last_arrival + self._debounce - loop.time()) > 0
                    ):
                        await asyncio.sleep(quiet)
                    batch = [(e, f) for e, f in backlog.entries if not f.done()]
                    backlog.entries.clear()
                    calls = fold([event for event, _ in batch], self._handlers)
                    for call in calls:
                        if call.handlers:
                            event = batch[call.handled][0]
                            skipped = tuple(batch[i][0] for i in call.skipped)
                            ctx = HandlerContext(lock_key, lock.token, skipped)
                            try:
                                await call_all(call.handlers, event, ctx)
                            except Exception as error:  # noqa: BLE001 - its dispatches re-raise it
                                call.failure = error
                        call.ran = True
                # the lock is released before the batch's dispatches return, as for HANDLED
                conclude(batch, calls)
                batch, calls = [], []
        except BaseException as error:
            # the lock could not be had (state unavailable) or was lost while the batch was being
            # handled: the calls that ran keep their outcome; the rest of the batch and every
            # waiting event fail (and are forgotten)
            conclude(batch, [call for call in calls if call.ran])
            settle([*batch, *backlog.entries], error)
            backlog.entries.clear()
            if not isinstance(error, Exception):
                raise
        finally:
            if self._backlogs.get(lock_key) is backlog:
                del self._backlogs[lock_key]

    # -- the durable inbox --------------------------------------------------------------------

    def _inbox(self) -> InboxState:
        if not isinstance(self._state, InboxState):
            raise TypeError(
                f"the durable inbox needs a state with the inbox capability (MemoryState, "
                f"RedisState, PostgresState, MySQLState); {type(self._state).__name__} has none yet"
            )
        return self._state

    def _check_durability(self) -> None:
        """Have the state check, in the background, whether its server keeps what it confirmed
        (it logs a warning if not): the accept or serve() that asks does not wait for it. One
        check at a time; asked again only until the state says it is settled, so an accept
        after that does nothing more."""
        state, self._durability = self._durability, None
        assert state is not None

        async def check() -> None:
            if not await state.check_durability():
                self._durability = state  # not settled (server out of reach): ask again later

        # kept apart from the dispatches (in_flight): aclose() waits for it (op_timeout at most)
        self._checking = asyncio.ensure_future(check())
        self._checking.set_name("asynclock durability check")

    async def accept(self, event: Event) -> Outcome:
        """Store ``event`` in its key's durable inbox; a worker's :meth:`serve` handles it.

        Returns ``ACCEPTED`` once the state confirmed the write (on Redis, in memory of the
        server, after ``WAIT`` with ``replicas=``; on PostgreSQL and MySQL after the commit; on
        :class:`MemoryState` in this process's memory only), or ``DUPLICATE`` when the event's dedupe key was seen within
        ``dedupe_ttl``. Never runs a handler. From the moment it returns ``ACCEPTED`` the event is
        not lost by any crash of any process (of the server's own durability aside).

        Raises:
            InboxFullError: the key holds ``max_pending`` undrained events (nothing is stored).
            TypeError: ``event.raw`` is not JSON-serializable, or the state has no inbox.
            StateUnavailableError: the state could not be reached (nothing may be stored: the
                platform should redeliver).
        """
        if not isinstance(event, Event):
            raise TypeError(f"accept() takes an Event, got {type(event).__name__}")
        inbox = self._inbox()
        started = asyncio.get_running_loop().time()
        if self._durability is not None:
            self._check_durability()
        lock_key = self.lock_key(event)
        claim = EventClaim.of(event, lock_key)
        result = await inbox.inbox_accept(
            lock_key,
            encode(event),
            claim=claim.key if claim is not None else None,
            claim_ttl=self._dedupe_ttl,
            max_pending=self._max_pending,
            lock_ttl=self._lock_ttl,
            with_entry=self._policy not in ("latest", "debounce", SUPERSEDE),
        )
        if result.status == "full":
            retry_after = self._retry_after(lock_key)
            logger.warning(
                "asynclock: inbox of %r is full (%d pending): event %s refused, retry after %.1f s",
                lock_key,
                result.pending,
                event.message_id,
                retry_after,
                extra={"lock_key": lock_key, "message_id": event.message_id},
            )
            raise InboxFullError(lock_key, retry_after)
        outcome = _DUPLICATE if result.status == "duplicate" else Outcome.ACCEPTED
        if outcome is not _DUPLICATE and self._policy == SUPERSEDE:
            # stored: interrupt the call that drains the key now, in whichever worker
            await signal_holder(self._state, lock_key)
        return await self._record(event, outcome, lock_key, started=started)

    async def serve(self, *, max_keys: int = MAX_KEYS) -> None:
        """Drain the durable inbox of this dispatcher's state until cancelled or :meth:`aclose`.

        Any number of processes may serve the same state: per lock key, events are handled one
        at a time, in accept order, by whichever worker holds the key's lock. A key with work
        is handed to one worker (docs/inbox.md, "Scaling workers"), which drains at most
        ``max_keys`` keys at once (default 64): more are left to the other workers. Each handling is
        recorded (``HANDLED``, or ``FAILED`` for an attempt that raised); an entry that failed
        ``max_attempts`` deliveries is dead-lettered, logged at ERROR, and the key goes on (or
        parks, ``on_poison="park"``). With ``retry_wait`` a failed entry waits in the state,
        holding no lock and no worker, until it is due (docs/inbox.md, "Retries and poison").

        Under ``on_lock_conflict="latest"`` the entries pending for a key are taken as one batch
        and folded as :meth:`dispatch` folds a backlog: per thread and route the newest is
        handled, the older ones are in its ``ctx.skipped`` (each recorded ``SKIPPED``); an
        entry leaves the inbox only once the call that covered it returned, and a call that
        fails its last attempt dead-letters all of its entries. ``"debounce"`` first waits until
        no entry arrived for ``debounce`` seconds (at most ``max(debounce, lock_ttl / 3)``).

        Raises:
            TypeError: the state has no inbox capability.
            ValueError: ``max_keys`` is not an int >= 1.
        """
        inbox = self._inbox()
        max_keys = _check_count(max_keys, "max_keys")
        if self._durability is not None:
            self._check_durability()
        stopping = asyncio.Event()
        if self._closed:
            stopping.set()
        self._stopping.add(stopping)
        folding: FoldingDrain | SupersedingDrain | None = None
        if self._policy == SUPERSEDE:
            folding = SupersedingDrain(
                self._state,
                inbox,
                self._handlers,
                grace=self._supersede_grace,
                max_attempts=self._max_attempts,
                record=self._record,
                observe=self._freeing.observe,
            )
        elif self._policy in ("latest", "debounce"):
            folding = FoldingDrain(
                inbox,
                self._handlers,
                debounce=self._debounce if self._policy == "debounce" else None,
                lock_ttl=self._lock_ttl,
                max_attempts=self._max_attempts,
                record=self._record,
                observe=self._freeing.observe,
                retry=self._retry,
            )
        drainer = Drainer(
            self._state,
            inbox,
            self._handlers,
            lock_ttl=self._lock_ttl,
            max_attempts=self._max_attempts,
            record=self._record,
            observe=self._freeing.observe,
            folding=folding,
            max_keys=max_keys,
            retry=self._retry,
        )
        try:
            await drainer.run(stopping)
        finally:
            self._stopping.discard(stopping)

    # -- background ---------------------------------------------------------------------------

    def _spawn(self, work: Awaitable[object], what: str) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.ensure_future(work)
        task.set_name(f"asynclock {what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def submit(self, event: Event) -> asyncio.Task[Outcome]:
        """Dispatch ``event`` in the background and return at once (for webhook endpoints).

        Errors are logged and recorded as ``FAILED``, never raised into the event loop's
        exception handler; :meth:`aclose` waits for everything submitted.

        The caller answers its platform before the outcome is known, so a busy key's event must
        not be dropped after that answer: ``on_lock_conflict="drop"`` is refused, and a policy
        function that picks ``"drop"`` for a submitted event has it queued instead (logged).
        ``queue_timeout`` still drops (logged at WARNING and counted): leave it unset here.

        Raises:
            RuntimeError: the dispatcher is closed.
            ValueError: ``on_lock_conflict`` is ``"drop"`` (use :meth:`deliver` and answer with
                the outcome, :meth:`accept` and :meth:`serve`, or another policy).
        """
        if self._closed:
            raise RuntimeError("EventDispatcher is closed: submit() after aclose()")
        if not isinstance(event, Event):
            raise TypeError(f"submit() takes an Event, got {type(event).__name__}")
        if self._policy == "drop":
            raise ValueError(
                "submit() answers before the outcome is known, so under on_lock_conflict='drop' "
                "a busy key's event would be lost after the platform was told it arrived; use "
                "deliver() and answer with its outcome, accept() + serve() (durable), or "
                "on_lock_conflict='queue'"
            )
        return cast("asyncio.Task[Outcome]", self._spawn(self._dispatch_quietly(event), "submit"))

    async def _dispatch_quietly(self, event: Event) -> Outcome:
        try:
            return await self._dispatch_event(event, submitted=True)
        except Exception:  # noqa: BLE001 - recorded as FAILED and logged by dispatch()
            return Outcome.FAILED

    async def aclose(self) -> None:
        """Stop accepting :meth:`submit`, then wait until every submitted event is done.

        A :meth:`serve` running on this dispatcher stops too: each key it drains finishes the
        entry in hand, releases its lock, and ``serve`` returns.
        """
        self._closed = True
        for stopping in self._stopping:
            stopping.set()
        while self._tasks:
            await asyncio.gather(*tuple(self._tasks), return_exceptions=True)
        if self._checking is not None:
            await asyncio.gather(self._checking, return_exceptions=True)
        # retries of "done" marks run until the state answers: not worth waiting for at exit
        # (each claim then lapses with its lease: at least once)
        marking = tuple(self._marking)
        for task in marking:
            task.cancel()
        await asyncio.gather(*marking, return_exceptions=True)
        await asyncio.sleep(0)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _jitter() -> float:
    """Up to half a second, to spread retries that would otherwise land together."""
    return random.uniform(0.0, 0.5)


def _name(function: object) -> str:
    return cast("str", getattr(function, "__qualname__", None) or repr(function))


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value
