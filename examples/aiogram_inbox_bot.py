"""A durable aiogram 3 webhook: each update stored before Telegram's 200, handled by workers.

Run it (Redis on 127.0.0.1:6379; the bot token from the environment)::

    TELEGRAM_BOT_TOKEN=123:ABC python -m examples.aiogram_inbox_bot            # the web process
    TELEGRAM_BOT_TOKEN=123:ABC asynclock worker examples.aiogram_inbox_bot:worker  # 1+ workers

``POST /telegram/webhook`` is :class:`~asynclock.integrations.aiogram.InboxRequestHandler`: the
update is stored in asynclock's durable inbox, then Telegram gets its 200; the web process runs
no handler (``WEB_SERVES=1`` makes it drain the inbox too). The workers feed stored updates to
aiogram's ``Dispatcher`` (:class:`~asynclock.integrations.aiogram.UpdateFeeder`): one chat's
updates one at a time, in order, across every worker; other chats in parallel. A web process
killed after answering loses nothing; a worker killed mid-update leaves it to another worker,
after ``ASYNCLOCK_LOCK_TTL`` seconds.

Both read ``ASYNCLOCK_STATE_URL``, ``ASYNCLOCK_PREFIX``, ``ASYNCLOCK_LOCK_TTL``,
``TELEGRAM_BOT_TOKEN``, ``TELEGRAM_API_URL`` (a Bot API server other than Telegram's, such as a
local one or a test's stand-in) and ``TELEGRAM_SECRET_TOKEN`` (``setWebhook``'s
``secret_token``, checked when set).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from aiogram import Bot, Dispatcher, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import PRODUCTION, TelegramAPIServer
from aiohttp import web

import asynclock
from asynclock import EventDispatcher, HandlerContext, State
from asynclock.integrations.aiogram import InboxRequestHandler, UpdateFeeder

if TYPE_CHECKING:
    from aiogram.types import Message

log = logging.getLogger("examples.aiogram_inbox_bot")

WEBHOOK_PATH = "/telegram/webhook"

DISPATCHER = web.AppKey("asynclock_dispatcher", EventDispatcher)
STATE = web.AppKey("asynclock_state", State)
HANDLER = web.AppKey("asynclock_webhook", InboxRequestHandler)
SERVING = web.AppKey("asynclock_serving", asyncio.Task[None])


def settings(name: str, default: str) -> str:
    return os.environ.get(name, default)


def telegram_bot(token: str | None = None, api_url: str | None = None) -> Bot:
    """The bot, talking to ``api_url`` (``$TELEGRAM_API_URL``, else Telegram's own servers)."""
    url = api_url or os.environ.get("TELEGRAM_API_URL")
    server = PRODUCTION if not url else TelegramAPIServer.from_base(url)
    return Bot(
        token=token or os.environ.get("TELEGRAM_BOT_TOKEN", ""),
        session=AiohttpSession(api=server),
    )


def build_dispatcher(delay: float = 0.0) -> Dispatcher:
    """aiogram's side: the bot's routers, as in any aiogram bot (here, one echo handler)."""
    router = Router()

    @router.message()
    async def reply(message: Message, bot: Bot, asynclock: HandlerContext) -> None:
        if delay:
            await asyncio.sleep(delay)  # the bot's "work"
        # asynclock.token fences writes to your own store; asynclock.attempt > 1 means this
        # update's earlier delivery did not finish (its worker died, or the handler raised)
        log.info("answering %s (attempt %s)", message.message_id, asynclock.attempt)
        await bot.send_message(
            message.chat.id, f"re: {message.text}", message_thread_id=message.message_thread_id
        )

    dp = Dispatcher()
    dp.include_router(router)
    return dp


def inbox_dispatcher(state: State, lock_ttl: float) -> EventDispatcher:
    """The asynclock side, the same in the web process and in every worker."""
    return EventDispatcher(state, on_lock_conflict="queue", lock_ttl=lock_ttl, max_attempts=5)


def create_app(
    state_url: str | None = None,
    prefix: str | None = None,
    *,
    token: str | None = None,
    api_url: str | None = None,
    lock_ttl: float | None = None,
    serve: bool | None = None,
    delay: float = 0.0,
    secret_token: str | None = None,
) -> web.Application:
    """The web process: ``POST /telegram/webhook`` stores each update, then answers 200.

    Args:
        state_url: where the inbox lives (default ``$ASYNCLOCK_STATE_URL``, local Redis).
        prefix: the key prefix of this bot's records (default ``$ASYNCLOCK_PREFIX``).
        token: the bot token (default ``$TELEGRAM_BOT_TOKEN``).
        api_url: the Bot API server's base URL (default ``$TELEGRAM_API_URL``, else Telegram's).
        lock_ttl: seconds a dead worker blocks its chat (default ``$ASYNCLOCK_LOCK_TTL``, 30).
        serve: also drain the inbox in this process (default ``$WEB_SERVES == "1"``).
        delay: seconds the handler pretends to work (when serving).
        secret_token: ``setWebhook``'s ``secret_token`` (default ``$TELEGRAM_SECRET_TOKEN``).
    """
    url = state_url or settings("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
    key_prefix = prefix or settings("ASYNCLOCK_PREFIX", "aiogram-inbox-bot:")
    ttl = lock_ttl or float(settings("ASYNCLOCK_LOCK_TTL", "30"))
    serving = serve if serve is not None else os.environ.get("WEB_SERVES") == "1"
    secret = secret_token or os.environ.get("TELEGRAM_SECRET_TOKEN") or None
    telegram = telegram_bot(token, api_url)

    async def start(app: web.Application) -> None:
        options = {} if url.startswith("memory:") else {"prefix": key_prefix}
        state = asynclock.state_from_url(url, **options)
        bot = inbox_dispatcher(state, ttl)
        app[STATE], app[DISPATCHER] = state, bot
        app[HANDLER] = InboxRequestHandler(bot, telegram, secret_token=secret)
        if serving:
            UpdateFeeder(bot, build_dispatcher(delay), telegram)
            app[SERVING] = asyncio.create_task(bot.serve())

    async def stop(app: web.Application) -> None:
        try:
            await app[DISPATCHER].aclose()  # serve() finishes the update in hand
            if SERVING in app:
                await app[SERVING]
        finally:
            await app[STATE].aclose()
            await telegram.session.close()

    async def webhook(request: web.Request) -> web.Response:
        return await request.app[HANDLER].handle(request)

    app = web.Application()
    app.router.add_post(WEBHOOK_PATH, webhook)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


async def worker() -> EventDispatcher:
    """``asynclock worker examples.aiogram_inbox_bot:worker``: feed stored updates to aiogram.

    ``asynclock worker`` serves the returned dispatcher until SIGTERM, then drains what it holds
    and closes its state; aiogram's shutdown handlers and the bot session close with the loop.
    """
    url = settings("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
    prefix = settings("ASYNCLOCK_PREFIX", "aiogram-inbox-bot:")
    state = asynclock.state_from_url(
        url, **({} if url.startswith("memory:") else {"prefix": prefix})
    )
    bot = inbox_dispatcher(state, float(settings("ASYNCLOCK_LOCK_TTL", "30")))
    delay = float(settings("ASYNCLOCK_EXAMPLE_DELAY", "0"))
    feeder = UpdateFeeder(bot, build_dispatcher(delay), telegram_bot())
    await feeder.start()  # aiogram's @dp.startup() handlers
    return bot


def main() -> None:
    """``python -m examples.aiogram_inbox_bot``: serve on 127.0.0.1:$PORT (8080)."""
    logging.basicConfig(level=logging.INFO)
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))


if __name__ == "__main__":
    main()
