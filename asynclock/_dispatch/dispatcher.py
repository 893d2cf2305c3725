"""EventDispatcher: events in, handlers out, one handler per lock key at a time, no silent loss.

Size: the public face of the dispatcher and the one record every event ends in, kept together
so that an event's path visits one module for both (docs/decisions.md, "What the path of one
event costs in modules"): the configuration, handler registration, the entry points
(``dispatch``, ``deliver``, ``submit``, ``accept``, ``serve``, ``aclose``), what every event
goes through around its route (the in-process duplicate check, the claim's end), and
:class:`OutcomeLog`, where a dispatch (and an inbox entry drained by ``serve()``, an event
stored by ``accept()``) ends up: counted in ``EventDispatcher.stats``, reported to the metrics
sink with its duration, logged on the ``asynclock`` logger at its outcome's level with the
event's keys, and handed to the ``on_outcome`` hook, whose own errors are logged and
swallowed: no silent loss.

Its parts live beside it: the route interface (``route.py``) and its implementations, the
general route (``general_route.py``), the fast route on MemoryState (``fast_route.py``) and the
supersede route (``_supersede/route.py``); the latest/debounce backlogs (``backlog.py``); the
settings they share (``context.py``); the conflict policies (``policies.py``); done-mark
retries (``done_marks.py``); webhook answers and ``Retry-After`` (``delivery.py``,
``freeing.py``); ``accept`` / ``serve`` (``_inbox/service.py``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import types
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Literal, TypeVar, cast, final

from asynclock import metrics as _metrics
from asynclock._cancel import finish_despite_cancellation
from asynclock._dedupe.claim import EventClaim
from asynclock._dispatch.context import DispatchContext
from asynclock._dispatch.delivery import Delivery, DeliveryAnswers
from asynclock._dispatch.done_marks import DoneMarks
from asynclock._dispatch.policies import SUPERSEDE, ConflictPolicy, check_policy, name
from asynclock._dispatch.route import pick_route
from asynclock._events.event import Event, Outcome
from asynclock._events.handlers import Handler, HandlerTable
from asynclock._inbox.drainer import MAX_KEYS
from asynclock._inbox.retry import retry_plan
from asynclock._inbox.service import InboxService
from asynclock._validate import check_count, check_key, check_seconds, check_ttl
from asynclock.metrics._active import active
from asynclock.state._base import ClosesOnExit
from asynclock.state._protocol import State

if TYPE_CHECKING:
    from asynclock._inbox.retry import PoisonPolicy


logger = logging.getLogger("asynclock")

OutcomeHook = Callable[[Event, Outcome, "BaseException | None"], "object | Awaitable[object]"]

LEVELS = {
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


class OutcomeLog:
    """The outcome counts of one dispatcher (``stats``) and its ``on_outcome`` hook."""

    __slots__ = ("hook", "stats")

    def __init__(self, hook: OutcomeHook | None) -> None:
        self.hook = hook
        self.stats: dict[Outcome, int] = dict.fromkeys(Outcome, 0)

    async def record(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Outcome:
        """Count and log ``outcome`` (:meth:`count`), then pass it to the ``on_outcome`` hook."""
        self.count(event, outcome, lock_key, error, started)
        hook = self.hook
        if hook is not None:
            try:
                result = hook(event, outcome, error)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("asynclock: the on_outcome hook failed")
        return outcome

    def count(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Outcome:
        """:meth:`record` but the ``on_outcome`` hook (all of it, without one): count and log."""
        self.stats[outcome] += 1
        if active.sink is not None and started is not None:
            duration = asyncio.get_running_loop().time() - started
            _metrics.report("dispatch_outcome", event.type, outcome.value, duration)
        level = LEVELS[outcome]
        if logger.isEnabledFor(level):  # the record's fields cost more than the rest of record()
            log(event, outcome, lock_key, level, error)
        return outcome


def log(
    event: Event, outcome: Outcome, lock_key: str, level: int, error: BaseException | None
) -> None:
    """Log ``event``'s ``outcome`` at ``level``, its keys as the record's fields."""
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


LockScope = Literal["thread", "channel"] | Callable[[Event], str]
H = TypeVar("H")

# Enum members on the hot path as module constants: each ``Outcome.X`` is an enum descriptor
# lookup (0.2 µs), several per dispatched event.
_DUPLICATE, _DROPPED = Outcome.DUPLICATE, Outcome.DROPPED


@final
class EventDispatcher(ClosesOnExit):
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
        "_answers",
        "_claims_here",
        "_closed",
        "_context",
        "_count",
        "_hooked",
        "_inbox",
        "_marks",
        "_outcomes",
        "_raise_errors",
        "_record",
        "_route",
        "_scope",
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
        check_policy(on_lock_conflict)
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
        lock_ttl = check_ttl(lock_ttl, "lock_ttl")
        dedupe_ttl = check_ttl(dedupe_ttl, "dedupe_ttl")
        debounce_seconds = check_seconds(debounce, "debounce", allow_zero=True)
        assert debounce_seconds is not None
        queue_timeout = check_seconds(queue_timeout, "queue_timeout", allow_none=True)
        max_attempts = check_count(max_attempts, "max_attempts")
        max_pending = check_count(max_pending, "max_pending")
        retry = retry_plan(retry_wait, on_poison)
        if on_lock_conflict == SUPERSEDE and (retry_wait is not None or on_poison != "dead_letter"):
            # a superseding drain retries and dead-letters by its own rules (an interruption is
            # not a failure): refused rather than silently ignored
            raise ValueError(
                f"retry_wait and on_poison='park' do not apply with on_lock_conflict='supersede' "
                f"(got retry_wait={retry_wait!r}, on_poison={on_poison!r})"
            )
        supersede_grace = check_seconds(
            supersede_grace, "supersede_grace", allow_zero=True, allow_none=True
        )
        context = self._context = DispatchContext(
            state,
            HandlerTable(),
            policy=on_lock_conflict,
            lock_ttl=lock_ttl,
            dedupe_ttl=dedupe_ttl,
            debounce=debounce_seconds,
            queue_timeout=queue_timeout,
            supersede_grace=supersede_grace,
        )
        self._scope = lock_scope
        self._raise_errors = bool(raise_errors)
        self._outcomes = OutcomeLog(on_outcome)
        # the outcome log's steps as slots: no attribute lookup more per event
        self._count = self._outcomes.count
        self._record = self._outcomes.record
        self._hooked = on_outcome is not None
        self._marks = DoneMarks(context)
        self._answers = DeliveryAnswers(context, self.lock_key)
        #: claim keys of the dispatches running in this process now
        self._claims_here: set[str] = set()
        self._closed = False
        # the route, picked once per state and policy
        self._route, superseding = pick_route(context)
        self._inbox = InboxService(
            state,
            context.handlers,
            key_of=self.lock_key,
            record=self._record,
            observe=context.freeing.observe,
            retry_after=self._answers.retry_after,
            lock_ttl=lock_ttl,
            dedupe_ttl=dedupe_ttl,
            max_pending=max_pending,
            max_attempts=max_attempts,
            retry=retry,
            folding=on_lock_conflict if on_lock_conflict in ("latest", "debounce") else None,
            debounce=debounce_seconds,
            superseding=superseding,
        )

    def __repr__(self) -> str:
        context = self._context
        policy = context.policy if isinstance(context.policy, str) else name(context.policy)
        return (
            f"<EventDispatcher on_lock_conflict={policy} lock_ttl={context.lock_ttl} "
            f"in_flight={len(context.tasks)} state={context.state!r}>"
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
        self._context.handlers.add(event_type, handler)

    # -- observability ------------------------------------------------------------------------

    @property
    def stats(self) -> Mapping[Outcome, int]:
        """Outcome -> how many dispatches ended with it (a live, read-only view)."""
        return types.MappingProxyType(self._outcomes.stats)

    @property
    def on_lock_conflict(self) -> ConflictPolicy:
        """The conflict policy, as given (a name, or the function asked per conflict)."""
        return self._context.policy

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called (``submit`` then raises ``RuntimeError``)."""
        return self._closed

    @property
    def in_flight(self) -> int:
        """Dispatches submitted or backlog drainers still running (for health checks)."""
        return len(self._context.tasks)

    @property
    def state(self) -> State:
        """The state the dispatcher's locks and dedupe records live in."""
        return self._context.state

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
        return await self._answers.answer(event, outcome)

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
                outcome = await self._route.route(event, lock_key, claim, loop, submitted=submitted)
            except asyncio.CancelledError:
                if claim is not None:  # handled: keep it; not handled: let a redelivery through
                    state = self._context.state
                    await finish_despite_cancellation(
                        self._marks.finish(claim) if claim.handled else claim.forget(state)
                    )
                raise
            except Exception as error:
                if claim is not None:
                    await finish_despite_cancellation(claim.forget(self._context.state))
                await self._record(event, Outcome.FAILED, lock_key, error, started)
                if self._raise_errors:
                    raise
                return Outcome.FAILED
            if claim is not None:
                if outcome is _DROPPED:
                    await claim.forget(self._context.state)
                elif not claim.marked_done:
                    await self._marks.finish(claim)
            if not self._hooked:  # nothing to await: no coroutine for the record
                return self._count(event, outcome, lock_key, started=started)
            return await self._record(event, outcome, lock_key, started=started)
        finally:
            if claim is not None:
                self._claims_here.discard(claim.key)

    # -- the durable inbox --------------------------------------------------------------------

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
        return await self._inbox.accept(event)

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
        await self._inbox.serve(max_keys)

    # -- background ---------------------------------------------------------------------------

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
        if self._context.policy == "drop":
            raise ValueError(
                "submit() answers before the outcome is known, so under on_lock_conflict='drop' "
                "a busy key's event would be lost after the platform was told it arrived; use "
                "deliver() and answer with its outcome, accept() + serve() (durable), or "
                "on_lock_conflict='queue'"
            )
        return cast(
            "asyncio.Task[Outcome]", self._context.spawn(self._dispatch_quietly(event), "submit")
        )

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
        self._inbox.stop()
        tasks = self._context.tasks
        while tasks:
            await asyncio.gather(*tuple(tasks), return_exceptions=True)
        await self._inbox.checked()
        await self._marks.cancel()
        await asyncio.sleep(0)
