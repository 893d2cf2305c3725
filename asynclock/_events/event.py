"""The dispatcher's value types: Event, Outcome and the handler's context."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    #: ``(event, outcome, lock_key, error)``: how the outcome of a drained inbox entry is
    #: recorded (the dispatcher's counters, log line and metrics)
    Recorder = Callable[["Event", "Outcome", str, BaseException | None], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Event:
    """One event from a chat or webhook platform, as the dispatcher sees it.

    Attributes:
        type: what happened (``"mention"``, ``"message"``, ``"action"``, ...); handlers are
            registered per type.
        adapter: the platform (``"slack"``, ``"instagram"``, ...).
        channel_id: the channel, inbox or account the event belongs to.
        thread_id: the conversation inside the channel.
        message_id: the platform's id of the message, when it has one (used for dedupe).
        raw: the platform's payload, untouched. A dedupe key falls back to ``raw["event_id"]``.

    Example:
        >>> e = Event(type="mention", adapter="slack", channel_id="C1", thread_id="T1",
        ...           message_id="m1")
        >>> e.thread_key, e.dedupe_key
        ('slack:C1:T1', 'm1')
    """

    type: str
    adapter: str
    channel_id: str
    thread_id: str
    message_id: str | None = None
    raw: Mapping[str, object] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for name in ("type", "adapter", "channel_id", "thread_id"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"Event.{name} must be a str, got {type(value).__name__} {value!r}")
        if self.message_id is not None and not isinstance(self.message_id, str):
            raise TypeError(
                f"Event.message_id must be a str or None, got {type(self.message_id).__name__} "
                f"{self.message_id!r}"
            )
        if not isinstance(self.raw, Mapping):
            raise TypeError(f"Event.raw must be a mapping, got {type(self.raw).__name__}")

    @property
    def thread_key(self) -> str:
        """``"<adapter>:<channel_id>:<thread_id>"``: the default lock key."""
        return f"{self.adapter}:{self.channel_id}:{self.thread_id}"

    @property
    def channel_key(self) -> str:
        """``"<adapter>:<channel_id>"``: the lock key of ``lock_scope="channel"``."""
        return f"{self.adapter}:{self.channel_id}"

    @property
    def dedupe_key(self) -> str | None:
        """``message_id``, else ``raw["event_id"]``, else ``None`` (no dedupe)."""
        if self.message_id:
            return self.message_id
        event_id = self.raw.get("event_id")
        if event_id is None or event_id == "":
            return None
        return str(event_id)


class Outcome(str, enum.Enum):
    """What :meth:`EventDispatcher.dispatch` did with an event.

    Example:
        A ``str`` enum: members equal their values, ``str()`` gives the value.

        >>> from asynclock import Outcome
        >>> Outcome.DROPPED == "dropped", str(Outcome.QUEUED), Outcome("handled").name
        (True, 'queued', 'HANDLED')
    """

    #: a handler ran under the lock and returned
    HANDLED = "handled"
    #: the event was seen before (within ``dedupe_ttl``); nothing ran
    DUPLICATE = "duplicate"
    #: the key was busy and the policy dropped it; its dedupe record was forgotten
    DROPPED = "dropped"
    #: the key was busy and the handler ran anyway, without the lock
    FORCED = "forced"
    #: the key was busy; the event waited for the lock, then was handled
    QUEUED = "queued"
    #: folded into a later handler call's ``ctx.skipped`` (policies latest/debounce)
    SKIPPED = "skipped"
    #: a handler raised (the exception is re-raised unless ``raise_errors=False``)
    FAILED = "failed"
    #: stored in the durable inbox by ``accept``; a worker's ``serve`` handles it
    ACCEPTED = "accepted"
    #: its handler was interrupted by a newer event (policy supersede); the call that handled
    #: the newer one covered it (in its ``ctx.skipped``) and returned
    SUPERSEDED = "superseded"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What a handler taking ``(event, ctx)`` learns about its call.

    Attributes:
        lock_key: the key the handler is serialized on.
        token: the fencing token of the lock it runs under; ``None`` when it runs without
            one (``force``, ``concurrent``). Pass it to the store you write to.
        skipped: older events folded into this call (policies ``latest`` and ``debounce``),
            oldest first.
        forced: the handler runs without the lock because of ``force``.
        attempt: deliveries of this event to a handler so far, this one included: ``1`` the
            first time; more when an inbox entry is redelivered after a failure or a crash.
        superseded: an :class:`asyncio.Event` set when a newer event of the key arrived
            (policy ``supersede``, from any process): stop soon; the task is cancelled
            ``supersede_grace`` seconds later. Never set under other policies.

    Example:
        >>> import asyncio
        >>> from asynclock import Event, EventDispatcher, HandlerContext, MemoryState
        >>> bot = EventDispatcher(MemoryState())
        >>> @bot.on("mention")
        ... async def reply(event: Event, ctx: HandlerContext) -> None:
        ...     print(ctx.lock_key, ctx.token is not None, ctx.skipped, ctx.forced)
        >>> _ = asyncio.run(bot.dispatch(Event("mention", "slack", "C1", "T1", "m1")))
        slack:C1:T1 True () False
    """

    lock_key: str
    token: int | None = None
    skipped: tuple[Event, ...] = ()
    forced: bool = False
    attempt: int = 1
    #: made on first use (most handlers never look): see the ``superseded`` property
    _superseded: asyncio.Event | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def superseded(self) -> asyncio.Event:
        """Set once a newer event supersedes this call (see the class's attributes)."""
        flag = self._superseded
        if flag is None:
            flag = asyncio.Event()
            object.__setattr__(self, "_superseded", flag)  # frozen: set once, lazily
        return flag
