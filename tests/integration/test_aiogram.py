"""asynclock.integrations.aiogram in a real aiogram ``Dispatcher`` behind its webhook, on Redis.

The app is ``examples/aiogram_bot.py``: aiogram's ``SimpleRequestHandler`` on aiohttp, fed
``Update`` JSON over HTTP; its ``Bot`` session points at the Telegram stand-in on loopback,
which records every ``sendMessage``. Every wait is for a reply or an answer, bounded.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from asynclock import Outcome
from examples import aiogram_bot
from tests._matrix import REDIS, purge_namespace, require
from tests.integration._processes import bot_processes
from tests.integration._standins import TELEGRAM_TOKEN, StandIn, serve_app, telegram_api

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import EventDispatcher

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

PATH = aiogram_bot.WEBHOOK_PATH
_update_ids = itertools.count(1000)


def update(chat: int, text: str, *, update_id: int | None = None) -> dict[str, object]:
    """A Telegram ``Update`` with a private-chat text message."""
    number = next(_update_ids) if update_id is None else update_id
    return {
        "update_id": number,
        "message": {
            "message_id": number,
            "date": 1700000000,
            "chat": {"id": chat, "type": "private"},
            "from": {"id": chat, "is_bot": False, "first_name": "u"},
            "text": text,
        },
    }


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    require(REDIS)
    made = uuid.uuid4().hex
    yield made
    await purge_namespace(REDIS, made)


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    async with telegram_api() as standin:
        yield standin


@asynccontextmanager
async def served(
    namespace: str, api: StandIn, *, delay: float, background: bool
) -> AsyncIterator[tuple[str, httpx.AsyncClient, EventDispatcher]]:
    app = aiogram_bot.create_app(
        REDIS.url,
        str(REDIS.options(namespace)["prefix"]),
        token=TELEGRAM_TOKEN,
        api_url=api.url,
        delay=delay,
        handle_in_background=background,
    )
    async with serve_app(app) as url, httpx.AsyncClient(timeout=30.0) as client:
        yield url + PATH, client, app[aiogram_bot.DISPATCHER]


def replies(api: StandIn, chat: int) -> list[str]:
    return [text.removeprefix("re: ") for text in api.recorder.texts(str(chat))]


async def test_one_chat_in_order_other_chats_in_parallel(namespace: str, api: StandIn) -> None:
    burst = 5
    async with served(namespace, api, delay=0.1, background=True) as (url, client, bot):
        # aiogram answers each update at once and handles it in the background: without the
        # middleware, the burst's handlers would run at the same time
        for n in range(burst):
            answer = await client.post(url, json=update(1, f"a{n}"))
            assert answer.status_code == 200
        assert (await client.post(url, json=update(2, "b0"))).status_code == 200
        await api.recorder.wait_for(lambda: len(api.recorder.replies) == burst + 1)
        assert replies(api, 1) == [f"a{n}" for n in range(burst)]
        # chat 2 did not wait for chat 1's burst (0.5 s of handlers, one at a time)
        order = [r.text for r in api.recorder.replies]
        assert order.index("re: b0") < order.index(f"re: a{burst - 1}")
        assert bot.stats[Outcome.QUEUED] >= 1


async def test_a_duplicate_update_is_never_answered_twice(namespace: str, api: StandIn) -> None:
    async with served(namespace, api, delay=0.05, background=False) as (url, client, bot):
        first = update(3, "once")
        # Telegram's redelivery arriving while the first is being handled, and after
        answers = await asyncio.gather(*(client.post(url, json=first) for _ in range(3)))
        again = await client.post(url, json=first)
        assert [a.status_code for a in (*answers, again)] == [200] * 4
        await client.post(url, json=update(3, "next"))
        assert replies(api, 3) == ["once", "next"]
        assert bot.stats[Outcome.DUPLICATE] == 3


@pytest.mark.processes
async def test_two_processes_sharing_redis_lose_nothing_and_reply_once_in_order(
    namespace: str, api: StandIn
) -> None:
    chats, per_chat = 4, 5
    sent = redeliveries = 0
    async with (
        bot_processes(
            "telegram",
            2,
            state_url=REDIS.url,
            prefix=str(REDIS.options(namespace)["prefix"]),
            api_url=api.url,
        ) as urls,
        httpx.AsyncClient(timeout=30.0) as client,
    ):

        async def chat(c: int) -> None:
            nonlocal sent, redeliveries
            for n in range(per_chat):
                body = update(100 + c, f"{c}-{n}")
                # to one process, then Telegram's redelivery of it to the other one
                first = await client.post(urls[n % 2] + PATH, json=body)
                retry = await client.post(urls[(n + 1) % 2] + PATH, json=body)
                assert (first.status_code, retry.status_code) == (200, 200)
                sent += 1
                redeliveries += 1

        await asyncio.gather(*(chat(c) for c in range(chats)))
        total = chats * per_chat
        await api.recorder.wait_for(lambda: len(api.recorder.replies) >= total)
    got = api.recorder.replies
    for c in range(chats):
        assert replies(api, 100 + c) == [f"{c}-{n}" for n in range(per_chat)]
    duplicates = len(got) - len({r.text for r in got})
    lost = total - len({r.text for r in got})
    print(
        f"telegram: updates={sent} redeliveries={redeliveries} replies={len(got)} "
        f"duplicates={duplicates} lost={lost}"
    )
    assert (len(got), duplicates, lost) == (total, 0, 0)
