"""The durable inbox's two ends in ``EventDispatcher``: ``accept()`` stores, ``serve()`` drains.

:class:`InboxService` is what ``EventDispatcher.accept`` and ``serve`` run: the accept's
write (with its claim, ``max_pending`` and the ``Retry-After`` of a full inbox), the state's
durability check (once, in the background), and each ``serve()``'s :class:`Drainer`, with the
key drain of its policy (``fold.py`` under ``latest`` / ``debounce``; under ``supersede``, the
one :class:`Superseding` gives, so this package never imports ``_supersede``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Literal, Protocol

from asynclock._dedupe.claim import EventClaim
from asynclock._errors import InboxFullError
from asynclock._events.codec import encode
from asynclock._events.event import Outcome
from asynclock._inbox.drainer import Drainer
from asynclock._inbox.fold import FoldingDrain
from asynclock._validate import check_count
from asynclock.state._protocol import DurabilityCheck, InboxState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock._events.event import Event, Recorder
    from asynclock._events.handlers import HandlerTable
    from asynclock._inbox.drainer import KeyDrain
    from asynclock._inbox.retry import RetryPlan
    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")

_DUPLICATE = Outcome.DUPLICATE


class Recording(Protocol):
    """How an outcome is recorded (counted, logged, passed to ``on_outcome``)."""

    def __call__(
        self,
        event: Event,
        outcome: Outcome,
        lock_key: str,
        error: BaseException | None = None,
        started: float | None = None,
    ) -> Awaitable[Outcome]:
        """Record ``outcome`` of ``event`` on ``lock_key`` (``started``: the loop time it began)."""
        ...


class Superseding(Protocol):
    """What ``on_lock_conflict="supersede"`` changes in the inbox (``_supersede/route.py``)."""

    def inbox_drain(
        self,
        inbox: InboxState,
        *,
        max_attempts: int,
        record: Recorder,
        observe: Callable[[str, float], None],
    ) -> KeyDrain:
        """How a held key is drained: a newer accept interrupts the running call."""
        ...

    def accepted(self, lock_key: str) -> Awaitable[None]:
        """An event of ``lock_key`` was stored: interrupt the call that drains the key now."""
        ...


class InboxService:
    """``accept()`` and the ``serve()`` calls of one dispatcher.

    Invariants: at most one durability check runs at a time, and none is started once the
    state said it is settled; every running ``serve()`` has its stop signal in
    :attr:`stopping`, set by :meth:`stop` (a ``serve()`` started after it stops at once).
    """

    __slots__ = (
        "checking",
        "closed",
        "debounce",
        "dedupe_ttl",
        "durability",
        "folding",
        "handlers",
        "key_of",
        "lock_ttl",
        "max_attempts",
        "max_pending",
        "observe",
        "record",
        "retry",
        "retry_after",
        "state",
        "stopping",
        "superseding",
    )

    def __init__(
        self,
        state: State,
        handlers: HandlerTable,
        *,
        key_of: Callable[[Event], str],
        record: Recording,
        observe: Callable[[str, float], None],
        retry_after: Callable[[str], float],
        lock_ttl: float,
        dedupe_ttl: float,
        max_pending: int,
        max_attempts: int,
        retry: RetryPlan,
        folding: Literal["latest", "debounce"] | None,
        debounce: float,
        superseding: Superseding | None,
    ) -> None:
        self.state = state
        self.handlers = handlers
        #: the event's lock key (``lock_scope``)
        self.key_of = key_of
        self.record = record
        #: a handling of a key took so many seconds (the ``Retry-After`` estimate)
        self.observe = observe
        #: when a retry on a busy (full) key should come
        self.retry_after = retry_after
        self.lock_ttl = lock_ttl
        self.dedupe_ttl = dedupe_ttl
        self.max_pending = max_pending
        self.max_attempts = max_attempts
        self.retry = retry
        #: ``latest`` / ``debounce``: a held key's entries are drained in folded batches
        self.folding = folding
        self.debounce = debounce
        self.superseding = superseding
        #: the state as a DurabilityCheck until its check settled (None while one runs)
        self.durability = state if isinstance(state, DurabilityCheck) else None
        self.checking: asyncio.Task[None] | None = None
        #: the stop signal of each running serve()
        self.stopping: set[asyncio.Event] = set()
        self.closed = False

    def inbox(self) -> InboxState:
        """The state as an :class:`InboxState`.

        Raises:
            TypeError: the state has no inbox capability.
        """
        if not isinstance(self.state, InboxState):
            raise TypeError(
                f"the durable inbox needs a state with the inbox capability (MemoryState, "
                f"RedisState, PostgresState, MySQLState); {type(self.state).__name__} has none yet"
            )
        return self.state

    def check_durability(self) -> None:
        """Have the state check, in the background, whether its server keeps what it confirmed
        (it logs a warning if not): the accept or serve() that asks does not wait for it. One
        check at a time; asked again only until the state says it is settled, so an accept
        after that does nothing more."""
        state, self.durability = self.durability, None
        assert state is not None

        async def check() -> None:
            if not await state.check_durability():
                self.durability = state  # not settled (server out of reach): ask again later

        # kept apart from the dispatches (in_flight): aclose() waits for it (op_timeout at most)
        self.checking = asyncio.ensure_future(check())
        self.checking.set_name("asynclock durability check")

    async def accept(self, event: Event) -> Outcome:
        """Store ``event`` in its key's inbox: ``ACCEPTED``, or ``DUPLICATE`` (see
        ``EventDispatcher.accept``, which checked that ``event`` is an Event).

        Raises:
            InboxFullError: the key holds ``max_pending`` undrained events (nothing is stored).
        """
        inbox = self.inbox()
        started = asyncio.get_running_loop().time()
        if self.durability is not None:
            self.check_durability()
        lock_key = self.key_of(event)
        claim = EventClaim.of(event, lock_key)
        result = await inbox.inbox_accept(
            lock_key,
            encode(event),
            claim=claim.key if claim is not None else None,
            claim_ttl=self.dedupe_ttl,
            max_pending=self.max_pending,
            lock_ttl=self.lock_ttl,
            with_entry=self.folding is None and self.superseding is None,
        )
        if result.status == "full":
            retry_after = self.retry_after(lock_key)
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
        if outcome is not _DUPLICATE and self.superseding is not None:
            # stored: interrupt the call that drains the key now, in whichever worker
            await self.superseding.accepted(lock_key)
        return await self.record(event, outcome, lock_key, started=started)

    async def serve(self, max_keys: int) -> None:
        """Drain the inbox until :meth:`stop` (see ``EventDispatcher.serve``).

        Raises:
            TypeError: the state has no inbox capability.
            ValueError: ``max_keys`` is not an int >= 1.
        """
        inbox = self.inbox()
        max_keys = check_count(max_keys, "max_keys")
        if self.durability is not None:
            self.check_durability()
        stopping = asyncio.Event()
        if self.closed:
            stopping.set()
        self.stopping.add(stopping)
        folding: KeyDrain | None = None
        if self.superseding is not None:
            folding = self.superseding.inbox_drain(
                inbox, max_attempts=self.max_attempts, record=self.record, observe=self.observe
            )
        elif self.folding is not None:
            folding = FoldingDrain(
                inbox,
                self.handlers,
                debounce=self.debounce if self.folding == "debounce" else None,
                lock_ttl=self.lock_ttl,
                max_attempts=self.max_attempts,
                record=self.record,
                observe=self.observe,
                retry=self.retry,
            )
        drainer = Drainer(
            self.state,
            inbox,
            self.handlers,
            lock_ttl=self.lock_ttl,
            max_attempts=self.max_attempts,
            record=self.record,
            observe=self.observe,
            folding=folding,
            max_keys=max_keys,
            retry=self.retry,
        )
        try:
            await drainer.run(stopping)
        finally:
            self.stopping.discard(stopping)

    def stop(self) -> None:
        """Stop every running ``serve()`` (each finishes the entries in hand), and any to come."""
        self.closed = True
        for stopping in self.stopping:
            stopping.set()

    async def checked(self) -> None:
        """Wait for the durability check running now, if any (its errors are its own)."""
        if self.checking is not None:
            await asyncio.gather(self.checking, return_exceptions=True)
