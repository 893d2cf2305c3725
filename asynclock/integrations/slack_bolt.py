"""Slack Bolt for Python (``slack_bolt.async_app.AsyncApp``): Events API requests through asynclock.

:class:`SlackEventsMiddleware` is a global Bolt middleware (``app.use(...)``). It runs after
Bolt's own request verification, so a request with a bad signature is refused before it sees
it. Each Events API delivery (``event_callback``) becomes an :class:`~asynclock.Event` and goes to
an :class:`~asynclock.EventDispatcher`, whose handlers (``@bot.on("app_mention")``) do the work;
every other request (commands, actions, shortcuts, views) goes on to Bolt's listeners untouched.

Requires the ``slack`` extra: ``pip install 'asynclock[slack]'``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, final

from asynclock import (
    Delivery,
    Event,
    EventDispatcher,
    InboxFullError,
    StateUnavailableError,
)
from asynclock.state._protocol import InboxState

if TYPE_CHECKING:
    from slack_bolt.request.async_request import AsyncBoltRequest

try:
    import slack_bolt  # noqa: F401 - only to name the extra when Bolt is missing
except ImportError as error:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "asynclock.integrations.slack_bolt needs Slack Bolt for Python: "
        "pip install 'asynclock[slack]'"
    ) from error

from slack_bolt.middleware.async_middleware import AsyncMiddleware
from slack_bolt.response import BoltResponse

__all__ = ("Mode", "SlackEventsMiddleware", "slack_event")

logger = logging.getLogger("asynclock")

#: how an Events API delivery is handed to the dispatcher (see :class:`SlackEventsMiddleware`)
Mode = Literal["submit", "accept", "dispatch"]
MODES: tuple[Mode, ...] = ("submit", "accept", "dispatch")


def _text(mapping: Mapping[str, object], name: str) -> str | None:
    value = mapping.get(name)
    return value if isinstance(value, str) and value else None


def slack_event(body: Mapping[str, object]) -> Event | None:
    """The :class:`~asynclock.Event` of an Events API envelope, ``None`` for any other request.

    * ``type``: the inner event's type (``"app_mention"``, ``"message"``, ...);
    * ``channel_id``: its ``channel`` (``item.channel`` for reactions), else the team id: an
      event without a channel is serialized on its own ``event_id`` only;
    * ``thread_id``: ``thread_ts`` (a reply in a thread), else ``ts`` (a top-level message
      starts its own thread), else the ``event_id``;
    * ``message_id``: Slack's ``event_id``, so a redelivery (``X-Slack-Retry-Num``) is a
      ``DUPLICATE``; ``raw``: the whole envelope, untouched.

    Example:
        >>> body = {"type": "event_callback", "event_id": "Ev1", "team_id": "T0",
        ...         "event": {"type": "app_mention", "channel": "C1", "ts": "1.2",
        ...                   "thread_ts": "1.1"}}
        >>> e = slack_event(body)
        >>> e.type, e.thread_key, e.dedupe_key
        ('app_mention', 'slack:C1:1.1', 'Ev1')
        >>> slack_event({"type": "url_verification", "challenge": "x"}) is None
        True
    """
    if body.get("type") != "event_callback":
        return None
    inner = body.get("event")
    event_id = _text(body, "event_id")
    if not isinstance(inner, Mapping) or event_id is None:
        return None
    item = inner.get("item")
    channel = _text(inner, "channel") or (
        _text(item, "channel") if isinstance(item, Mapping) else None
    )
    ts = _text(inner, "ts")
    return Event(
        type=_text(inner, "type") or "event",
        adapter="slack",
        channel_id=channel or _text(body, "team_id") or "-",
        thread_id=(_text(inner, "thread_ts") or ts or event_id) if channel else event_id,
        message_id=event_id,
        raw=body,
    )


def _header(headers: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = headers.get(name)
    return values[0] if values else None


@final
class SlackEventsMiddleware(AsyncMiddleware):
    """A Bolt middleware that hands each Events API delivery to an :class:`EventDispatcher`.

    Register it with ``app.use(SlackEventsMiddleware(bot))``. Slack wants an answer within
    3 seconds and redelivers an unanswered or non-2xx delivery up to 3 times
    (``X-Slack-Retry-Num`` 1-3); ``mode`` says when the answer is given:

    * ``"submit"`` (default): ``bot.submit(event)`` and 200 at once; the handlers run after the
      answer, in this process. A dispatcher with ``on_lock_conflict="drop"`` is refused (a busy
      thread's event would be dropped after Slack got its 200): use ``"queue"``. An event in
      hand when the process dies is lost. A redelivery (``X-Slack-Retry-Num``: Slack did not
      get the first answer in time) is answered as in ``"dispatch"``, after its outcome.
    * ``"accept"``: ``await bot.accept(event)`` (the durable inbox), 200 once it is stored,
      503 + ``Retry-After`` when its thread's inbox is full or the state is down (nothing
      stored: Slack redelivers). Processes running ``bot.serve()`` handle it, per thread one at
      a time in accept order; no crash of any process loses it after the 200.
    * ``"dispatch"``: ``await bot.deliver(event)`` and answer with what happened: 200 when dealt
      with, **503 + ``Retry-After``** when it was ``DROPPED`` because its thread was busy (the
      dispatcher forgot its dedupe record, so Slack's redelivery is handled) or is a duplicate
      of a delivery still in progress (maybe in a process that died: after the lease, the
      redelivery runs it), 500 when a handler failed. Only for handlers that finish well within
      3 seconds.

    Invariants:

    * A redelivery of an event (same ``event_id``) that was handled is a ``DUPLICATE`` and
      answered 200: Slack stops retrying, nothing runs twice. One whose first delivery is still
      in progress (its claim leased: by a live process, or by one that died) is never answered
      2xx in modes ``"submit"`` and ``"dispatch"``: 503 with ``Retry-After`` (the lease's
      remaining time), and the retry after the lease runs it if nobody finished it. In mode
      ``"accept"`` an event that was stored is answered 200: the inbox, not Slack, delivers it
      again to a live worker.
    * Every delivery with ``X-Slack-Retry-Num`` is logged (INFO, with ``X-Slack-Retry-Reason``)
      and counted in :attr:`redeliveries`.
    * Requests that are not Events API deliveries (slash commands, actions, shortcuts, views,
      ``url_verification``) go on to Bolt unchanged.

    Args:
        bot: the dispatcher whose handlers handle the events (``@bot.on("app_mention")``, each
            taking ``(event)`` or ``(event, ctx)``: ``event.raw`` is Slack's envelope,
            ``ctx.token`` the thread lock's fencing token).
        mode: ``"submit"``, ``"accept"`` or ``"dispatch"``, as above.
    """

    def __init__(self, bot: EventDispatcher, *, mode: Mode = "submit") -> None:
        if not isinstance(bot, EventDispatcher):
            raise TypeError(f"SlackEventsMiddleware needs an EventDispatcher, got {bot!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if mode == "submit" and bot.on_lock_conflict == "drop":
            raise ValueError(
                "mode='submit' answers Slack before the event is handled, so a dispatcher with "
                "on_lock_conflict='drop' would drop busy threads' events after their 200; use "
                "on_lock_conflict='queue', or mode='accept' / 'dispatch'"
            )
        if mode == "accept" and not isinstance(bot.state, InboxState):
            # refused here, not by every delivery's accept() answering 500 to Slack
            raise TypeError(
                f"mode='accept' needs a state with the durable inbox (MemoryState, RedisState); "
                f"{type(bot.state).__name__} has none"
            )
        self._bot = bot
        self._mode: Mode = mode
        self._redeliveries = 0

    def __repr__(self) -> str:
        return f"<SlackEventsMiddleware mode={self._mode} redeliveries={self._redeliveries}>"

    @property
    def bot(self) -> EventDispatcher:
        """The dispatcher the events go to."""
        return self._bot

    @property
    def mode(self) -> Mode:
        """When Slack gets its answer: ``"submit"``, ``"accept"`` or ``"dispatch"``."""
        return self._mode

    @property
    def redeliveries(self) -> int:
        """Deliveries that carried ``X-Slack-Retry-Num`` (Slack's retries), since creation."""
        return self._redeliveries

    async def async_process(
        self,
        *,
        req: AsyncBoltRequest,
        resp: BoltResponse,
        next: Callable[[], Awaitable[BoltResponse]],
    ) -> BoltResponse | None:
        """Answer an Events API delivery per :attr:`mode`; pass any other request on."""
        event = slack_event(req.body)
        if event is None:
            return await next()
        retry = _header(req.headers, "x-slack-retry-num")
        if retry is not None:
            self._redeliveries += 1
            reason = _header(req.headers, "x-slack-retry-reason")
            logger.info(
                "asynclock: Slack redelivery %s of event %s (%s)",
                retry,
                event.message_id,
                reason,
                extra={"message_id": event.message_id, "retry_num": retry, "retry_reason": reason},
            )
        if self._mode == "accept":
            return await self._accept(event)
        if self._mode == "dispatch" or retry is not None:
            # a redelivery in mode "submit" too: its first delivery may be in progress in a
            # process that died, and a 200 would make Slack stop asking (#30)
            return self._answer(event, await self._bot.deliver(event))
        try:
            self._bot.submit(event)
        except RuntimeError:  # the dispatcher is closing: Slack redelivers to a live process
            return _refuse(event, "shutting down", 1)
        return BoltResponse(status=200, body="")

    async def _accept(self, event: Event) -> BoltResponse:
        try:
            await self._bot.accept(event)
        except InboxFullError as full:
            return _refuse(event, "inbox full", math.ceil(full.retry_after))
        except StateUnavailableError:
            logger.warning(
                "asynclock: state unavailable, Slack event %s not stored (answered 503)",
                event.message_id,
                extra={"message_id": event.message_id},
            )
            return _refuse(event, "state unavailable", 1)
        return BoltResponse(status=200, body="")

    def _answer(self, event: Event, delivery: Delivery) -> BoltResponse:
        if not delivery.redeliver:
            return BoltResponse(status=200, body="")
        if delivery.retry_after is None:
            return BoltResponse(status=500, body={"error": "handler failed"})
        why = "in progress" if delivery.in_progress else "thread busy"
        return _refuse(event, why, math.ceil(delivery.retry_after))


def _refuse(event: Event, why: str, retry_after: int) -> BoltResponse:
    seconds = str(max(1, retry_after))
    return BoltResponse(
        status=503,
        body={"error": why, "event_id": event.message_id},
        headers={"Retry-After": seconds},
    )
