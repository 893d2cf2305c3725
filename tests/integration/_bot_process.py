"""One bot process of the cross-process tests: ``python -m tests.integration._bot_process KIND``.

``KIND`` is ``slack`` (``examples.slack_bolt_bot``), ``telegram`` (``examples.aiogram_bot``),
``telegram-inbox`` (``examples.aiogram_inbox_bot``) or ``telegram-isolation``
(``examples.aiogram_isolation_bot``). Configured by the environment the test sets:
``BOT_STATE_URL``, ``BOT_PREFIX`` (the shared Redis namespace) and ``BOT_API_URL`` (the test's
API stand-in); ``BOT_SERVE`` (``0``: a web process that only stores and acknowledges, draining
nothing), ``BOT_MODE`` (Slack's middleware mode), ``BOT_DELAY`` (seconds each handler works) and
``BOT_LOCK_TTL`` (the dispatcher's ``lock_ttl``). Serves on 127.0.0.1:<free
port>, prints ``PORT <n>`` once it answers, and runs until SIGTERM, then shuts down cleanly
(the app's cleanup drains what it holds).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from aiohttp import web


def build(kind: str) -> web.Application:
    url, prefix, api = (
        os.environ["BOT_STATE_URL"],
        os.environ["BOT_PREFIX"],
        os.environ["BOT_API_URL"],
    )
    serve = os.environ.get("BOT_SERVE", "1") == "1"
    delay = float(os.environ.get("BOT_DELAY", "0.02"))
    lock_ttl = float(os.environ.get("BOT_LOCK_TTL", "30"))
    if kind == "slack":
        from asynclock.integrations.slack_bolt import MODES
        from examples import slack_bolt_bot
        from tests.integration._standins import BOT_TOKEN, SIGNING_SECRET

        mode = os.environ.get("BOT_MODE", "accept")
        assert mode in MODES, f"BOT_MODE must be one of {MODES}, got {mode!r}"
        return slack_bolt_bot.create_app(
            url,
            prefix,
            signing_secret=SIGNING_SECRET,
            token=BOT_TOKEN,
            api_url=api,
            delay=delay,
            serve=serve,
            mode=mode,
            lock_ttl=lock_ttl,
        )
    from tests.integration._standins import TELEGRAM_TOKEN

    if kind == "telegram-isolation":
        from examples import aiogram_isolation_bot

        return aiogram_isolation_bot.create_app(
            url, prefix, token=TELEGRAM_TOKEN, api_url=api, delay=delay
        )
    if kind == "telegram-inbox":
        from examples import aiogram_inbox_bot

        return aiogram_inbox_bot.create_app(
            url,
            prefix,
            token=TELEGRAM_TOKEN,
            api_url=api,
            serve=serve,
            delay=delay,
            lock_ttl=lock_ttl,
        )
    from examples.aiogram_bot import create_app

    return create_app(
        url, prefix, token=TELEGRAM_TOKEN, api_url=api, delay=delay, lock_ttl=lock_ttl
    )


async def main(kind: str) -> None:
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    runner = web.AppRunner(build(kind), handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        print(f"PORT {runner.addresses[0][1]}", flush=True)
        await stopping.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
