"""aiogram's updates as asynclock events: the mapping, and the outer middleware on updates.

``dp.update.outer_middleware(UpdateMiddleware(bot))`` makes aiogram's handling of every update
a delivery through an :class:`~asynclock.EventDispatcher`: a redelivered update (same
``update_id``) is a ``DUPLICATE`` and never handled twice, one chat's updates are handled one at
a time (per the dispatcher's ``on_lock_conflict``), across every process sharing the
dispatcher's state, and the handler receives the :class:`~asynclock.HandlerContext` as the
``asynclock`` keyword (``ctx.token``). A redelivery of an update still being handled (maybe by a
process that died) is answered 503 with ``Retry-After``, never 2xx.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, final

from aiogram import BaseMiddleware, Bot
from aiogram.dispatcher.event.bases import UNHANDLED, SkipHandler
from aiogram.dispatcher.middlewares.user_context import (
    EVENT_CONTEXT_KEY,
    EventContext,
    UserContextMiddleware,
)
from aiogram.types import TelegramObject, Update
from aiohttp import web

from asynclock import Event, EventDispatcher, HandlerContext
from asynclock._validate import check_key

__all__ = ("UpdateInProgressError", "UpdateMiddleware", "telegram_event")

#: aiogram's next step in the middleware chain, as aiogram types it
NextHandler = Callable[[TelegramObject, dict[str, Any]], Awaitable[Any]]


def telegram_event(
    update: Update, context: EventContext, *, bot_id: int, per_thread: bool = False
) -> Event:
    """The :class:`~asynclock.Event` of a Telegram update.

    * ``type``: the update's kind (``"message"``, ``"callback_query"``, ...);
    * ``channel_id``: the chat id; for updates without a chat (inline queries, ...)
      ``user:<id>`` of the sender; ``thread_id``: the forum topic's ``message_thread_id`` when
      ``per_thread`` and the update is in a topic, else ``"chat"`` (one conversation per chat);
    * ``message_id``: ``<bot id>:<update_id>``, the dedupe key (update ids are per bot);
    * ``raw``: the update as JSON (``Update.model_dump(mode="json")``, unset fields left out).

    Example:
        >>> from aiogram.types import Update
        >>> from aiogram.dispatcher.middlewares.user_context import UserContextMiddleware
        >>> update = Update.model_validate({"update_id": 7, "message": {
        ...     "message_id": 1, "date": 0, "chat": {"id": 5, "type": "private"}, "text": "hi"}})
        >>> context = UserContextMiddleware.resolve_event_context(update)
        >>> e = telegram_event(update, context, bot_id=42)
        >>> e.type, e.thread_key, e.dedupe_key
        ('message', 'telegram:5:chat', '42:7')
    """
    try:
        kind = update.event_type
    except LookupError:  # aiogram's UpdateTypeLookupError: a kind it does not know yet
        kind = "update"
    if context.chat is not None:
        channel = str(context.chat.id)
    elif context.user is not None:
        channel = f"user:{context.user.id}"
    else:  # nobody to serialize against: the update is its own conversation
        channel = f"update:{update.update_id}"
    thread = str(context.thread_id) if per_thread and context.thread_id is not None else "chat"
    return Event(
        type=kind,
        adapter="telegram",
        channel_id=channel,
        thread_id=thread,
        message_id=f"{bot_id}:{update.update_id}",
        raw=update.model_dump(mode="json", exclude_unset=True),
    )


class UpdateInProgressError(web.HTTPServiceUnavailable, SkipHandler):
    """A redelivered update is still being handled: answered 503 with ``Retry-After``.

    Raised by :class:`UpdateMiddleware` for a delivery whose update is being handled elsewhere
    (or was, by a process that died: its claim is leased until ``retry_after`` seconds from
    now). It is an aiohttp ``HTTPServiceUnavailable``, so aiogram's webhook handlers on aiohttp
    answer Telegram 503 and Telegram delivers the update again later; with another web framework,
    map it to a 503 yourself. A 2xx would make Telegram forget an update that may never be
    handled. It is also aiogram's ``SkipHandler``, which aiogram's errors middleware passes on
    without calling the error handlers: a catch-all ``@dp.error()`` cannot turn it into a 200.

    Attributes:
        update_id: the update's id.
        retry_after: seconds until the first delivery's claim lapses if nobody finishes it.
    """

    def __init__(self, update_id: int, retry_after: float) -> None:
        self.update_id = update_id
        self.retry_after = retry_after
        seconds = str(max(1, math.ceil(retry_after)))
        super().__init__(
            headers={"Retry-After": seconds},
            text=f"update {update_id} is being handled; deliver it again later",
        )


@dataclass
class _Call:
    """aiogram's rest of the chain for one update, run by the dispatcher's handler."""

    handler: NextHandler
    update: Update
    data: dict[str, Any]
    ran: bool = False
    result: Any = None


@final
class UpdateMiddleware(BaseMiddleware):
    """An aiogram outer middleware on updates that handles each one under an EventDispatcher.

    Register it on the dispatcher's update observer: ``dp.update.outer_middleware(
    UpdateMiddleware(bot))``, with ``bot`` an :class:`EventDispatcher` kept for this purpose
    (the middleware registers the ``"*"`` handler that continues aiogram's chain; register no
    handlers of your own on it). Per update, in order: dedupe by ``update_id``, lock the
    update's chat (or forum topic), then aiogram's filters and handlers run under the lock.

    Invariants:

    * An update already handled anywhere the state is shared is a ``DUPLICATE``: aiogram's
      handlers do not run, the middleware returns ``UNHANDLED`` (Telegram gets its 200).
    * An update being handled (its claim leased: by a live process, or by one that died) is a
      ``DUPLICATE`` too, and nothing runs, but the middleware raises
      :class:`UpdateInProgressError`: aiogram's webhook handler answers 503 with
      ``Retry-After``, so Telegram keeps the update and delivers it again; once the claim
      lapsed, that delivery runs it. (With ``handle_in_background=True``, aiogram's own default,
      Telegram has its 200 before anything runs: use ``False``, or the durable webhook.)
    * Per chat at most one handler runs at a time; with ``on_lock_conflict="queue"`` the chat's
      updates are handled in arrival order (per process). Other chats run in parallel.
    * Under ``"drop"`` a busy chat's update is ``DROPPED``: logged at WARNING and counted by the
      dispatcher, and Telegram is not told (aiogram's webhook handler has answered 200 already,
      or answers 200 with nothing to send). ``"latest"`` and ``"debounce"`` handle the newest
      update of a burst and return ``UNHANDLED`` for the folded ones (``ctx.skipped``).
    * A handler's exception goes on to aiogram's error handlers (with ``raise_errors=True``,
      the dispatcher's default) after the dispatcher recorded it as ``FAILED``.

    Args:
        bot: the dispatcher (its state, policy, TTLs, ``on_outcome``).
        per_thread: serialize per forum topic (``message_thread_id``) instead of per chat.
        context_key: the keyword under which handlers receive the
            :class:`~asynclock.HandlerContext` (``async def h(message, asynclock)``).
    """

    def __init__(
        self, bot: EventDispatcher, *, per_thread: bool = False, context_key: str = "asynclock"
    ) -> None:
        if not isinstance(bot, EventDispatcher):
            raise TypeError(f"UpdateMiddleware needs an EventDispatcher, got {bot!r}")
        self._bot = bot
        self._per_thread = bool(per_thread)
        self._key = check_key(context_key, "context_key")
        #: the updates being dispatched in this process, and how to continue each
        self._calls: dict[Event, _Call] = {}
        bot.add_handler("*", self._continue)

    def __repr__(self) -> str:
        return f"<UpdateMiddleware per_thread={self._per_thread} in_flight={len(self._calls)}>"

    @property
    def bot(self) -> EventDispatcher:
        """The dispatcher the updates go through."""
        return self._bot

    async def __call__(
        self, handler: NextHandler, event: TelegramObject, data: dict[str, Any]
    ) -> Any:
        """Dispatch ``event`` (an ``Update``); aiogram's chain runs as the dispatcher's handler."""
        if not isinstance(event, Update):  # registered on another observer: leave it alone
            return await handler(event, data)
        context = data.get(EVENT_CONTEXT_KEY)
        if not isinstance(context, EventContext):
            context = UserContextMiddleware.resolve_event_context(event)
        telegram_bot = data.get("bot")
        bot_id = telegram_bot.id if isinstance(telegram_bot, Bot) else 0
        key = telegram_event(event, context, bot_id=bot_id, per_thread=self._per_thread)
        call = _Call(handler, event, data)
        # a second delivery of an update in flight here is a DUPLICATE (the dispatcher decides
        # it before anything runs): it must not take over the first one's continuation
        mine = self._calls.setdefault(key, call) is call
        try:
            delivery = await self._bot.deliver(key)
        finally:
            if mine:
                del self._calls[key]
        if delivery.in_progress:
            assert delivery.retry_after is not None
            raise UpdateInProgressError(event.update_id, delivery.retry_after)
        return call.result if call.ran else UNHANDLED

    async def _continue(self, event: Event, ctx: HandlerContext) -> None:
        call = self._calls.get(event)
        if call is None:
            raise RuntimeError(
                f"UpdateMiddleware's dispatcher got event {event.message_id!r} that no update "
                "in flight belongs to: dispatch Telegram updates through the middleware only"
            )
        call.data[self._key] = ctx
        call.result = await call.handler(call.update, call.data)
        call.ran = True
