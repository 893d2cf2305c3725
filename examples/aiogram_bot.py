"""An aiogram 3 Telegram bot behind its aiohttp webhook: each chat answered in order, once.

Run it (Redis on 127.0.0.1:6379; the bot token from the environment)::

    TELEGRAM_BOT_TOKEN=123:ABC python -m examples.aiogram_bot     # PORT=8080 by default

``POST /telegram/webhook`` is aiogram's ``SimpleRequestHandler``; every update goes through
:class:`~asynclock.integrations.aiogram.UpdateMiddleware`: a redelivered update (same
``update_id``) is not answered twice, one chat's messages are answered one at a time in order
across every worker process sharing Redis, and other chats run in parallel. The handler gets
``asynclock`` (the :class:`~asynclock.HandlerContext`, with ``ctx.token``).

By default the webhook answers once the update is handled (``handle_in_background=False``): a
process that dies mid-update leaves Telegram without its 200, so Telegram redelivers and
another worker handles it once the dead one's lock lapsed.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from aiogram import Bot, Dispatcher, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import PRODUCTION, TelegramAPIServer
from aiogram.webhook.aiohttp_server import SimpleRequestHandler, setup_application
from aiohttp import web

import asynclock
from asynclock import EventDispatcher, HandlerContext, PolicyName, State
from asynclock.integrations.aiogram import UpdateMiddleware

if TYPE_CHECKING:
    from aiogram.types import Message

log = logging.getLogger("examples.aiogram_bot")

DEFAULT_STATE_URL = os.environ.get("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
DEFAULT_PREFIX = os.environ.get("ASYNCLOCK_PREFIX", "aiogram-bot:")
WEBHOOK_PATH = "/telegram/webhook"

DISPATCHER = web.AppKey("asynclock_dispatcher", EventDispatcher)
STATE = web.AppKey("asynclock_state", State)


def build_router(delay: float) -> Router:
    """The bot's one handler: answer a text message in its chat (and forum topic)."""
    router = Router()

    @router.message()
    async def reply(message: Message, bot: Bot, asynclock: HandlerContext) -> None:
        if delay:
            await asyncio.sleep(delay)  # the bot's "work"
        # asynclock.token, the chat lock's fencing token, fences writes to your own store
        log.info("answering %s (token %s)", message.message_id, asynclock.token)
        await bot.send_message(
            message.chat.id, f"re: {message.text}", message_thread_id=message.message_thread_id
        )

    return router


def create_app(
    state_url: str = DEFAULT_STATE_URL,
    prefix: str = DEFAULT_PREFIX,
    *,
    token: str | None = None,
    api_url: str | None = None,
    on_lock_conflict: PolicyName = "queue",
    per_thread: bool = False,
    handle_in_background: bool = False,
    delay: float = 0.0,
    lock_ttl: float = 30.0,
) -> web.Application:
    """The aiohttp app serving aiogram's webhook handler on ``POST /telegram/webhook``.

    Args:
        state_url: where locks and dedupe records live (shared by every worker process).
        prefix: the key prefix of this bot's records on the server.
        token: the bot token (default ``$TELEGRAM_BOT_TOKEN``).
        api_url: the Bot API server's base URL (tests point it at a stand-in on loopback).
        on_lock_conflict: what a busy chat's update does (``"queue"``: waits its turn).
        per_thread: one conversation per forum topic instead of per chat.
        handle_in_background: answer Telegram before handling (aiogram's default) instead of
            after.
        delay: seconds the handler pretends to work.
        lock_ttl: seconds of each chat's lock between renewals, and of an update's claim: a
            process that died mid-update holds its chat and its update that long.
    """
    server = PRODUCTION if api_url is None else TelegramAPIServer.from_base(api_url)
    bot = Bot(
        token=token or os.environ.get("TELEGRAM_BOT_TOKEN", ""),
        session=AiohttpSession(api=server),
    )
    dp = Dispatcher()
    dp.include_router(build_router(delay))

    async def start(app: web.Application) -> None:
        options = {} if state_url.startswith("memory:") else {"prefix": prefix}
        state = asynclock.state_from_url(state_url, **options)
        dispatcher = EventDispatcher(state, on_lock_conflict=on_lock_conflict, lock_ttl=lock_ttl)
        dp.update.outer_middleware(UpdateMiddleware(dispatcher, per_thread=per_thread))
        app[STATE], app[DISPATCHER] = state, dispatcher

    async def stop(app: web.Application) -> None:
        await app[STATE].aclose()

    app = web.Application()
    app.on_startup.append(start)
    SimpleRequestHandler(dp, bot, handle_in_background=handle_in_background).register(
        app, path=WEBHOOK_PATH
    )
    setup_application(app, dp, bot=bot)  # aiogram's startup/shutdown (closes the bot session)
    app.on_cleanup.append(stop)
    return app


def main() -> None:
    """``python -m examples.aiogram_bot``: serve on 127.0.0.1:$PORT (8080)."""
    logging.basicConfig(level=logging.INFO)
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))


if __name__ == "__main__":
    main()
