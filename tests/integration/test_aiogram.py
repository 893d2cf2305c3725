"""asynclock.integrations.aiogram in a real aiogram ``Dispatcher`` behind its webhook, on Redis.

The app is ``examples/aiogram_bot.py``: aiogram's ``SimpleRequestHandler`` on aiohttp, fed
``Update`` JSON over HTTP; its ``Bot`` session points at the Telegram stand-in on loopback,
which records every ``sendMessage``. Every wait is for a reply or an answer, bounded.
"""

from __future__ import annotations

import asyncio
import itertools
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from asynclock import Outcome, RedisState
from examples import aiogram_bot
from tests._matrix import REDIS
from tests.integration._processes import bot_processes, deliver_each_twice, holder_pid, tally
from tests.integration._redelivery import TELEGRAM_RETRIES, redeliver
from tests.integration._standins import TELEGRAM_TOKEN, StandIn, serve_app, telegram_api

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import EventDispatcher

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

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
async def api() -> AsyncIterator[StandIn]:
    async with telegram_api() as standin:
        yield standin


@asynccontextmanager
async def served(
    prefix: str, api: StandIn, *, delay: float, background: bool
) -> AsyncIterator[tuple[str, httpx.AsyncClient, EventDispatcher]]:
    app = aiogram_bot.create_app(
        REDIS.url,
        prefix,
        token=TELEGRAM_TOKEN,
        api_url=api.url,
        delay=delay,
        handle_in_background=background,
    )
    async with serve_app(app) as url, httpx.AsyncClient(timeout=30.0) as client:
        yield url + PATH, client, app[aiogram_bot.DISPATCHER]


def replies(api: StandIn, chat: int) -> list[str]:
    return [text.removeprefix("re: ") for text in api.recorder.texts(str(chat))]


async def test_one_chat_in_order_other_chats_in_parallel(prefix: str, api: StandIn) -> None:
    burst = 5
    async with served(prefix, api, delay=0.1, background=True) as (url, client, bot):
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


async def test_a_duplicate_update_is_never_answered_twice(prefix: str, api: StandIn) -> None:
    async with served(prefix, api, delay=0.05, background=False) as (url, client, bot):
        first = update(3, "once")
        # Telegram's redeliveries arriving while the first is being handled: 503, not 200 (the
        # handler may die, and a 200 makes Telegram forget the update: #30); one after: 200
        answers = await asyncio.gather(*(client.post(url, json=first) for _ in range(3)))
        assert sorted(a.status_code for a in answers) == [200, 503, 503]
        assert all(int(a.headers["Retry-After"]) >= 1 for a in answers if a.status_code == 503)
        again = await client.post(url, json=first)
        assert again.status_code == 200
        await client.post(url, json=update(3, "next"))
        assert replies(api, 3) == ["once", "next"]
        assert bot.stats[Outcome.DUPLICATE] == 3


@pytest.mark.processes
async def test_two_processes_sharing_redis_lose_nothing_and_reply_once_in_order(
    prefix: str, api: StandIn
) -> None:
    chats, per_chat = 4, 5
    bodies = {(c, n): update(100 + c, f"{c}-{n}") for c in range(chats) for n in range(per_chat)}
    async with (
        bot_processes("telegram", 2, state_url=REDIS.url, prefix=prefix, api_url=api.url) as bots,
        httpx.AsyncClient(timeout=30.0) as client,
    ):

        async def send(url: str, c: int, n: int, retry: int | None) -> int:
            # a redelivery is the same update again (same update_id)
            return (await client.post(url + PATH, json=bodies[c, n])).status_code

        sent = await deliver_each_twice(bots.urls, chats, per_chat, send)
        await api.recorder.wait_for(lambda: len(api.recorder.replies) >= sent)
    expected = {str(100 + c): [f"{c}-{n}" for n in range(per_chat)] for c in range(chats)}
    figures, got = tally(api.recorder, expected, redeliveries=sent)
    print(f"telegram, 2 processes: {figures}")
    assert got == expected
    assert (figures.replies, figures.duplicates, figures.lost) == (sent, 0, 0)


@pytest.mark.processes
async def test_a_redelivery_after_the_handling_process_died_is_handled(
    prefix: str, api: StandIn
) -> None:
    """The process handling an update is SIGKILLed mid-handler (``handle_in_background=False``:
    Telegram has no answer yet); Telegram retries it at the other process (#30). While the dead
    process's claim is leased the retries are answered 503, not 200 (which would make Telegram
    forget the update); the first one after the lease runs it."""
    body = update(51, "survives")
    state = RedisState.from_url(REDIS.url, prefix=prefix)
    try:
        async with (
            bot_processes(
                "telegram", 2, state_url=REDIS.url, prefix=prefix, api_url=api.url,
                settings={"BOT_LOCK_TTL": "3"}, each=[{"BOT_DELAY": "60"}, {"BOT_DELAY": "0.02"}],
            ) as bots,
            httpx.AsyncClient(timeout=30.0) as client,
        ):  # fmt: skip
            first = asyncio.ensure_future(client.post(bots.urls[0] + PATH, json=body))
            assert await holder_pid(state, "telegram:51:chat") == bots.processes[0].pid
            await bots.kill(0)  # mid-handler
            with pytest.raises(httpx.TransportError):
                await first
            answers = await redeliver(
                lambda n: client.post(bots.urls[1] + PATH, json=body),
                retries=TELEGRAM_RETRIES,
                honour_retry_after=False,  # Telegram keeps its own schedule
            )
    finally:
        await state.aclose()
    print(f"telegram, handling process killed: Telegram's retries answered {answers}")
    assert answers[0] == "503", answers  # the dead process's claim is leased
    assert answers[-1] == "200", answers
    assert set(answers[:-1]) == {"503"}, answers
    assert replies(api, 51) == ["survives"]
