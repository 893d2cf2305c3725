"""The durable aiogram webhook: store the update, answer Telegram, let workers feed aiogram.

aiogram's webhook handlers answer Telegram before handling by default
(``handle_in_background=True``): the update then lives in one task of one process, and a deploy's
SIGKILL loses it. Telegram's own advice (tdlib/telegram-bot-api#341) is to put the update in a
broker, confirm, and process it with a pool of workers. Here the broker is asynclock's inbox:

* :class:`InboxRequestHandler` (the web process) stores each update with
  :meth:`EventDispatcher.accept` and answers 200 once it is stored;
* :class:`UpdateFeeder` (every worker: ``asynclock worker app:worker``) is the dispatcher's
  handler: each stored update goes to aiogram's ``Dispatcher.feed_update``, one at a time per
  chat, in accept order, across every worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
from typing import TYPE_CHECKING, Any, final

from aiogram import Bot, Dispatcher
from aiogram.dispatcher.middlewares.user_context import UserContextMiddleware
from aiogram.methods import TelegramMethod
from aiogram.types import Update
from aiohttp import web
from pydantic import ValidationError

from asynclock import (
    Event,
    EventDispatcher,
    HandlerContext,
    InboxFullError,
    StateUnavailableError,
)
from asynclock._validate import check_key
from asynclock.integrations.aiogram._update import telegram_event

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ("InboxRequestHandler", "UpdateFeeder")

logger = logging.getLogger("asynclock")

#: the header Telegram sends the webhook's ``secret_token`` in
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"


@final
class InboxRequestHandler:
    """Telegram's webhook on aiohttp: each update stored in the durable inbox, then 200.

    ``InboxRequestHandler(bot, telegram).register(app, path="/webhook")``, as aiogram's
    ``SimpleRequestHandler``. ``bot`` is the :class:`~asynclock.EventDispatcher` whose
    :meth:`~asynclock.EventDispatcher.serve` the workers run (with an :class:`UpdateFeeder`).

    Invariants:

    * 200 only once the update is stored (:meth:`~asynclock.EventDispatcher.accept` returned):
      from then on no crash of any process loses it. A redelivery of a stored update (same
      ``update_id``) is a ``DUPLICATE``: 200, nothing stored twice; the inbox, not Telegram,
      delivers it to a worker again if one dies.
    * 503 with ``Retry-After`` when nothing could be stored (the chat's inbox holds
      ``max_pending`` updates, or the state is unreachable): Telegram delivers it again.
    * 401 for a wrong ``X-Telegram-Bot-Api-Secret-Token`` (when ``secret_token`` is set), 400
      for a body that is not an update. No handler runs in this process.

    Args:
        bot: the dispatcher whose inbox stores the updates (its state, ``dedupe_ttl``,
            ``max_pending``).
        telegram: the aiogram ``Bot`` the updates are for (its id keys the dedupe records; no
            request is made with it here).
        secret_token: the ``secret_token`` given to ``setWebhook``; checked when set.
        per_thread: one conversation per forum topic instead of per chat (as
            :class:`UpdateMiddleware`).
    """

    def __init__(
        self,
        bot: EventDispatcher,
        telegram: Bot,
        *,
        secret_token: str | None = None,
        per_thread: bool = False,
    ) -> None:
        if not isinstance(bot, EventDispatcher):
            raise TypeError(f"InboxRequestHandler needs an EventDispatcher, got {bot!r}")
        if not isinstance(telegram, Bot):
            raise TypeError(f"InboxRequestHandler needs an aiogram Bot, got {telegram!r}")
        self._bot = bot
        self._telegram = telegram
        self._secret = None if secret_token is None else check_key(secret_token, "secret_token")
        self._per_thread = bool(per_thread)

    def __repr__(self) -> str:
        return f"<InboxRequestHandler bot_id={self._telegram.id} per_thread={self._per_thread}>"

    @property
    def bot(self) -> EventDispatcher:
        """The dispatcher whose inbox the updates go to."""
        return self._bot

    def register(self, app: web.Application, /, path: str, **kwargs: Any) -> None:
        """Serve ``POST path`` on ``app`` (``kwargs`` go to aiohttp's ``add_route``)."""
        app.router.add_route("POST", path, self.handle, **kwargs)

    async def handle(self, request: web.Request) -> web.Response:
        """Store the update of ``request`` and answer Telegram."""
        if self._secret is not None and not secrets.compare_digest(
            request.headers.get(SECRET_HEADER, ""), self._secret
        ):
            return web.Response(status=401, text="Unauthorized")
        try:
            update = Update.model_validate(await request.json(), context={"bot": self._telegram})
        except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as error:
            logger.warning("asynclock: webhook body is not a Telegram update: %s", error)
            return web.json_response({"error": "not a Telegram update"}, status=400)
        context = UserContextMiddleware.resolve_event_context(update)
        event = telegram_event(
            update, context, bot_id=self._telegram.id, per_thread=self._per_thread
        )
        try:
            await self._bot.accept(event)
        except InboxFullError as full:
            return _busy(update.update_id, "inbox full", full.retry_after)
        except StateUnavailableError:
            logger.warning(
                "asynclock: state unavailable, Telegram update %s not stored (answered 503)",
                update.update_id,
                extra={"message_id": event.message_id},
            )
            return _busy(update.update_id, "state unavailable", 1.0)
        return web.json_response({})

    __call__ = handle


def _busy(update_id: int, why: str, retry_after: float) -> web.Response:
    return web.json_response(
        {"error": why, "update_id": update_id},
        status=503,
        headers={"Retry-After": str(max(1, math.ceil(retry_after)))},
    )


@final
class UpdateFeeder:
    """The workers' side: each update the inbox hands out goes to aiogram's ``Dispatcher``.

    ``UpdateFeeder(bot, dp, telegram)`` registers the one ``"*"`` handler of ``bot`` (an
    :class:`~asynclock.EventDispatcher` kept for this purpose); ``bot.serve()`` (or
    ``asynclock worker app:worker``) then drains the inbox that :class:`InboxRequestHandler`
    fills.

    Invariants:

    * Per chat (per forum topic with ``per_thread``), one update at a time, in accept order,
      across every worker sharing the state; other chats in parallel.
    * An update leaves the inbox only once ``dp.feed_update`` returned: a worker killed
      mid-update leaves it to another worker (after ``lock_ttl``), which feeds it again
      (``ctx.attempt`` 2). A handler's exception that aiogram's error handlers do not take is
      retried, up to ``max_attempts`` deliveries, then dead-lettered.
    * A ``TelegramMethod`` a handler returns (a webhook reply) is sent with the bot, as aiogram's
      polling does (``Dispatcher.silent_call_request``).
    * Handlers get the :class:`~asynclock.HandlerContext` under ``context_key`` (``ctx.token``
      fences writes; ``ctx.attempt`` counts deliveries), and ``data`` as aiogram's workflow data.

    Args:
        bot: the dispatcher whose inbox is drained.
        dispatcher: aiogram's ``Dispatcher`` (routers, filters, FSM, ...).
        telegram: the aiogram ``Bot`` handlers talk to Telegram with.
        context_key: the keyword under which handlers receive the ``HandlerContext``.
        data: more keyword arguments for aiogram's handlers (aiogram's workflow data).
    """

    def __init__(
        self,
        bot: EventDispatcher,
        dispatcher: Dispatcher,
        telegram: Bot,
        *,
        context_key: str = "asynclock",
        **data: Any,
    ) -> None:
        if not isinstance(bot, EventDispatcher):
            raise TypeError(f"UpdateFeeder needs an EventDispatcher, got {bot!r}")
        if not isinstance(dispatcher, Dispatcher):
            raise TypeError(f"UpdateFeeder needs an aiogram Dispatcher, got {dispatcher!r}")
        if not isinstance(telegram, Bot):
            raise TypeError(f"UpdateFeeder needs an aiogram Bot, got {telegram!r}")
        self._bot = bot
        self._dispatcher = dispatcher
        self._telegram = telegram
        self._key = check_key(context_key, "context_key")
        self._data: Mapping[str, Any] = data
        self._started = False
        self._closer: asyncio.Task[None] | None = None
        bot.add_handler("*", self._feed)

    def __repr__(self) -> str:
        return f"<UpdateFeeder bot_id={self._telegram.id} started={self._started}>"

    @property
    def bot(self) -> EventDispatcher:
        """The dispatcher whose inbox feeds aiogram (what ``asynclock worker`` serves)."""
        return self._bot

    async def start(self) -> None:
        """Run aiogram's startup handlers (``@dp.startup()``) now, and its shutdown handlers
        and the bot session's close when this event loop shuts down (``asyncio.run`` ending, as
        ``asynclock worker`` does after its drain) or at :meth:`aclose`, whichever comes first.

        Call it from the worker's factory (an ``async def`` that ``asynclock worker`` awaits).
        """
        if self._started:
            return
        self._started = True
        await self._dispatcher.emit_startup(**self._workflow())
        self._closer = asyncio.ensure_future(self._close_at_exit())

    async def aclose(self) -> None:
        """Run aiogram's shutdown handlers (if :meth:`start` ran) and close the bot's session."""
        closer, self._closer = self._closer, None
        if closer is not None:
            closer.cancel()
            await asyncio.gather(closer, return_exceptions=True)
        else:
            await self._telegram.session.close()

    async def _close_at_exit(self) -> None:
        try:
            await asyncio.Event().wait()  # until cancelled: by aclose(), or the loop's shutdown
        finally:
            try:
                await self._dispatcher.emit_shutdown(**self._workflow())
            finally:
                await self._telegram.session.close()

    def _workflow(self) -> dict[str, Any]:
        return {
            **self._dispatcher.workflow_data,
            "dispatcher": self._dispatcher,
            "bot": self._telegram,
            **self._data,
        }

    async def _feed(self, event: Event, ctx: HandlerContext) -> None:
        update = Update.model_validate(event.raw, context={"bot": self._telegram})
        data = {**self._data, self._key: ctx}
        result = await self._dispatcher.feed_update(self._telegram, update, **data)
        if isinstance(result, TelegramMethod):
            await self._dispatcher.silent_call_request(bot=self._telegram, result=result)
