"""The durable aiogram webhook (``examples/aiogram_inbox_bot.py``) over real HTTP, on Redis.

aiogram's real ``Dispatcher`` and ``Bot``; the Bot's session points at the Telegram stand-in on
loopback, which records every ``sendMessage``. The web process stores and answers; workers
(``asynclock worker examples.aiogram_inbox_bot:worker``, as in production) feed aiogram. Every
wait is for a reply or an answer, bounded.
"""

from __future__ import annotations

import asyncio
import itertools
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from asynclock import EventDispatcher, Outcome, RedisState
from asynclock.integrations.aiogram import UpdateFeeder
from examples import aiogram_inbox_bot
from tests._matrix import REDIS
from tests.integration._processes import (
    asynclock_workers,
    bot_processes,
    held,
    tally,
)
from tests.integration._standins import TELEGRAM_TOKEN, StandIn, serve_app, telegram_api
from tests.integration.test_aiogram import update

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

#: seconds a wait that includes starting a process may take: importing aiogram alone costs about
#: 10 s of CPU (its pydantic models), several times that on a loaded 2-core machine
STARTUP = 150.0

PATH = aiogram_inbox_bot.WEBHOOK_PATH
WORKER = "examples.aiogram_inbox_bot:worker"


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    async with telegram_api() as standin:
        yield standin


def worker_env(prefix: str, api: StandIn, **more: str) -> dict[str, str]:
    return {
        "ASYNCLOCK_STATE_URL": REDIS.url,
        "ASYNCLOCK_PREFIX": prefix,
        "TELEGRAM_BOT_TOKEN": TELEGRAM_TOKEN,
        "TELEGRAM_API_URL": api.url,
        **more,
    }


def replies(api: StandIn, chat: int) -> list[str]:
    return [text.removeprefix("re: ") for text in api.recorder.texts(str(chat))]


@asynccontextmanager
async def in_loop_worker(prefix: str, api: StandIn) -> AsyncIterator[EventDispatcher]:
    """A worker in the test's loop: the example's dispatchers, serving the namespace."""
    state = RedisState.from_url(REDIS.url, prefix=prefix)
    bot = aiogram_inbox_bot.inbox_dispatcher(state, lock_ttl=5.0)
    feeder = UpdateFeeder(
        bot,
        aiogram_inbox_bot.build_dispatcher(0.01),
        aiogram_inbox_bot.telegram_bot(TELEGRAM_TOKEN, api.url),
    )
    await feeder.start()
    serving = asyncio.create_task(bot.serve())
    try:
        yield bot
    finally:
        await bot.aclose()
        await serving
        await feeder.aclose()
        await state.aclose()


async def test_stored_then_answered_and_handled_in_order_per_chat(
    prefix: str, api: StandIn
) -> None:
    app = aiogram_inbox_bot.create_app(
        REDIS.url, prefix, token=TELEGRAM_TOKEN, api_url=api.url, serve=False, secret_token="s3"
    )
    secret = {"X-Telegram-Bot-Api-Secret-Token": "s3"}
    async with serve_app(app) as url, httpx.AsyncClient(timeout=30.0) as client:
        web_bot = app[aiogram_inbox_bot.DISPATCHER]
        sent = {chat: [update(chat, f"{chat}-{n}") for n in range(4)] for chat in (21, 22)}
        for n in range(4):
            for chat in (21, 22):
                answer = await client.post(url + PATH, json=sent[chat][n], headers=secret)
                assert answer.status_code == 200
        # Telegram's redelivery of a stored update: 200, stored once
        again = await client.post(url + PATH, json=sent[21][0], headers=secret)
        assert again.status_code == 200
        assert (web_bot.stats[Outcome.ACCEPTED], web_bot.stats[Outcome.DUPLICATE]) == (8, 1)
        wrong = await client.post(url + PATH, json=update(21, "x"), headers={})
        bad = await client.post(url + PATH, content=b"not json", headers=secret)
        assert (wrong.status_code, bad.status_code) == (401, 400)
        assert api.recorder.replies == []  # the web process runs no handler
        async with in_loop_worker(prefix, api):
            await api.recorder.wait_for(lambda: len(api.recorder.replies) == 8)
    assert replies(api, 21) == [f"21-{n}" for n in range(4)]
    assert replies(api, 22) == [f"22-{n}" for n in range(4)]


@pytest.mark.processes
async def test_a_web_process_killed_after_answering_and_a_worker_killed_lose_nothing(
    prefix: str, api: StandIn
) -> None:
    chats, per_chat = 3, 4
    bodies = {(c, n): update(300 + c, f"{c}-{n}") for c in range(chats) for n in range(per_chat)}
    env = worker_env(prefix, api, ASYNCLOCK_LOCK_TTL="2", ASYNCLOCK_EXAMPLE_DELAY="0.3")
    state = RedisState.from_url(REDIS.url, prefix=prefix)
    try:
        async with httpx.AsyncClient(timeout=30.0) as client:
            async with bot_processes(
                "telegram-inbox", 1, state_url=REDIS.url, prefix=prefix, api_url=api.url,
                serve=False,
            ) as web:  # fmt: skip
                for n in range(per_chat):
                    for c in range(chats):
                        answer = await client.post(web.urls[0] + PATH, json=bodies[c, n])
                        assert answer.status_code == 200
                await web.kill(0)  # SIGKILL right after the last 200: nothing handled yet
            assert api.recorder.replies == []
            async with asynclock_workers(WORKER, env, 1) as first:
                # the only worker takes chat 300 and dies in its handler
                await held(state, "telegram:300:chat", within=STARTUP)
                await first.kill(0)
            # another worker takes the chat over once the dead one's lock ran out (2 s)
            async with asynclock_workers(WORKER, env, 1):
                await api.recorder.wait_for(
                    lambda: (
                        {r.text for r in api.recorder.replies}
                        >= {f"re: {c}-{n}" for c, n in bodies}
                    ),
                    seconds=STARTUP,
                )
    finally:
        await state.aclose()
    expected = {str(300 + c): [f"{c}-{n}" for n in range(per_chat)] for c in range(chats)}
    figures, got = tally(api.recorder, expected, redeliveries=0)
    print(f"telegram inbox, web process and a worker killed: {figures}")
    assert figures.lost == 0
    # at least once: a worker killed between its reply and its acknowledgement is redelivered,
    # so an update may be answered twice in a row, never out of order
    assert {
        chat: [k for k, _ in itertools.groupby(texts)] for chat, texts in got.items()
    } == expected
