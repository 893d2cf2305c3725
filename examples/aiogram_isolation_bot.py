"""An aiogram 3 bot whose FSM is isolated per chat with asynclock: ``events_isolation``.

Run it (Redis on 127.0.0.1:6379; the bot token from the environment), in as many processes as
you like behind one webhook URL::

    TELEGRAM_BOT_TOKEN=123:ABC python -m examples.aiogram_isolation_bot     # PORT=8080

The bot counts each user's messages in its FSM data (aiogram's ``RedisStorage``, shared by the
processes) and answers with the count: a read, then a write, the race of aiogram#1317, where a
burst of messages reads the same count and increments are lost. With
``Dispatcher(events_isolation=EventIsolation(state))`` aiogram holds an asynclock lock per user in
chat around each update, in every process: the counts go 1, 2, 3, ... however the updates are
spread. It is a drop-in for aiogram's ``RedisEventIsolation``, which polls, serves waiters in no
order and lets go after 60 s even if the handler still runs; this one is woken by the release,
is renewed while the handler runs, and works on PostgreSQL and MySQL too
(``ASYNCLOCK_STATE_URL``).

Environment: ``ASYNCLOCK_STATE_URL``, ``ASYNCLOCK_PREFIX``, ``TELEGRAM_BOT_TOKEN``,
``TELEGRAM_API_URL`` (a Bot API server other than Telegram's: a local one, or a test's stand-in).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from aiogram import Bot, Dispatcher, Router
from aiogram.client.session.aiohttp import AiohttpSession
from aiogram.client.telegram import PRODUCTION, TelegramAPIServer
from aiogram.fsm.storage.base import DefaultKeyBuilder
from aiogram.fsm.storage.redis import RedisStorage
from aiogram.webhook.aiohttp_server import SimpleRequestHandler, setup_application
from aiohttp import web

from asynclock.integrations.aiogram import EventIsolation, isolation_token

if TYPE_CHECKING:
    from aiogram.fsm.context import FSMContext
    from aiogram.types import Message

log = logging.getLogger("examples.aiogram_isolation_bot")

WEBHOOK_PATH = "/telegram/webhook"


def build_router(delay: float) -> Router:
    """Count the user's messages in the FSM data and answer with the count."""
    router = Router()

    @router.message()
    async def count(message: Message, state: FSMContext, bot: Bot) -> None:
        data = await state.get_data()  # read ...
        if delay:
            await asyncio.sleep(delay)  # the bot's "work" between its read and its write
        seen = int(data.get("seen", 0)) + 1
        await state.update_data(seen=seen)  # ... then write: safe only under the isolation
        # isolation_token() fences writes to your own store, as ctx.token does elsewhere
        log.info("message %s: count %s (token %s)", message.message_id, seen, isolation_token())
        await bot.send_message(message.chat.id, str(seen))

    return router


def create_app(
    state_url: str | None = None,
    prefix: str | None = None,
    *,
    token: str | None = None,
    api_url: str | None = None,
    delay: float = 0.0,
) -> web.Application:
    """aiogram's webhook (``SimpleRequestHandler``, answering before handling, its default) with
    the FSM in Redis and asynclock's isolation.

    Args:
        state_url: where the isolation's locks live (default ``$ASYNCLOCK_STATE_URL``).
        prefix: the key prefix of this bot's locks and FSM records (``$ASYNCLOCK_PREFIX``).
        token: the bot token (default ``$TELEGRAM_BOT_TOKEN``).
        api_url: the Bot API server's base URL (default ``$TELEGRAM_API_URL``, else Telegram's).
        delay: seconds the handler works between its read and its write.
    """
    url = state_url or os.environ.get("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
    key_prefix = prefix or os.environ.get("ASYNCLOCK_PREFIX", "aiogram-isolation-bot:")
    api = api_url or os.environ.get("TELEGRAM_API_URL")
    bot = Bot(
        token=token or os.environ.get("TELEGRAM_BOT_TOKEN", ""),
        session=AiohttpSession(api=TelegramAPIServer.from_base(api) if api else PRODUCTION),
    )
    # the FSM data stays in aiogram's RedisStorage (its Redis); the isolation may be elsewhere
    storage = RedisStorage.from_url(
        os.environ.get("FSM_REDIS_URL", "redis://127.0.0.1:6379/0"),
        key_builder=DefaultKeyBuilder(prefix=f"{key_prefix}fsm", with_bot_id=True),
    )
    # EventIsolation.from_url owns its state: aiogram's shutdown closes it
    isolation = (
        EventIsolation.from_url(url)  # one process only: memory:// takes no prefix
        if url.startswith("memory:")
        else EventIsolation.from_url(url, prefix=key_prefix)
    )
    dp = Dispatcher(storage=storage, events_isolation=isolation)
    dp.include_router(build_router(delay))
    app = web.Application()
    SimpleRequestHandler(dp, bot).register(app, path=WEBHOOK_PATH)
    setup_application(app, dp, bot=bot)  # aiogram's startup and shutdown (closes the session)
    return app


def main() -> None:
    """``python -m examples.aiogram_isolation_bot``: serve on 127.0.0.1:$PORT (8080)."""
    logging.basicConfig(level=logging.INFO)
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))


if __name__ == "__main__":
    main()
