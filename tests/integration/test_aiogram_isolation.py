"""``EventIsolation`` in real aiogram ``Dispatcher``\\ s, on every backend.

Updates are fed with ``Dispatcher.feed_update`` (what aiogram's polling and webhook handlers
call); two dispatchers on two clients of one state stand for two processes (a real two-process
run is the ``aiogram`` benchmark, against aiogram's ``RedisEventIsolation``). The handlers send
nothing to Telegram. Every wait is on an event a handler sets, bounded.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
import pytest
from aiogram import Bot, Dispatcher
from aiogram.fsm.storage.base import StorageKey
from aiogram.fsm.storage.memory import MemoryStorage
from aiogram.types import Message, Update

from asynclock import AsyncLock, LockLostError
from asynclock.integrations.aiogram import EventIsolation, isolation_token
from asynclock.state import LockAdmin
from examples.aiogram_isolation_bot import WEBHOOK_PATH
from tests._matrix import REDIS
from tests.integration._processes import bot_processes
from tests.integration._standins import telegram_api

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from aiogram.fsm.context import FSMContext

    from asynclock import State

pytestmark = pytest.mark.timeout(60)

BOUND = 20.0
_ids = itertools.count(1)


def message(chat: int, text: str) -> Update:
    number = next(_ids)
    return Update.model_validate(
        {
            "update_id": number,
            "message": {
                "message_id": number,
                "date": 0,
                "chat": {"id": chat, "type": "private"},
                "from": {"id": chat, "is_bot": False, "first_name": "u"},
                "text": text,
            },
        }
    )


@dataclass
class Seen:
    """What the handlers did: who runs now per chat, the most at once, the order, the tokens."""

    running: dict[int, int] = field(default_factory=dict)
    most: dict[int, int] = field(default_factory=dict)
    order: list[tuple[int, str, int | None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def enter(self, chat: int, text: str) -> None:
        self.running[chat] = self.running.get(chat, 0) + 1
        self.most[chat] = max(self.most.get(chat, 0), self.running[chat])
        self.order.append((chat, text, isolation_token()))
        self._touch()

    def leave(self, chat: int) -> None:
        self.running[chat] -= 1
        self._touch()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        async def waiting() -> None:
            while not condition():
                await self._changed.wait()

        await asyncio.wait_for(waiting(), BOUND)

    def texts(self, chat: int) -> list[str]:
        return [text for c, text, _ in self.order if c == chat]

    def tokens(self, chat: int) -> list[int]:
        return [t for c, _, t in self.order if c == chat and t is not None]


def build(isolation: EventIsolation, seen: Seen, storage: MemoryStorage) -> Dispatcher:
    dp = Dispatcher(storage=storage, events_isolation=isolation)

    @dp.message()
    async def count(message: Message, state: FSMContext) -> None:
        chat = message.chat.id
        seen.enter(chat, message.text or "")
        try:
            # read-modify-write of the FSM data (aiogram#1317: without isolation, a burst's
            # handlers read the same value and increments are lost)
            data = await state.get_data()
            await asyncio.sleep(0.02 if message.text != "slow" else 1.5)
            await state.update_data(n=int(data.get("n", 0)) + 1)
        finally:
            seen.leave(chat)

    return dp


@pytest.fixture
async def telegram() -> AsyncIterator[Bot]:
    made = Bot(token="42:ISOLATION-TEST")  # handlers send nothing: no request leaves
    yield made
    await made.session.close()


async def test_one_chat_at_a_time_across_two_clients_in_order_other_chats_meanwhile(
    state: State, peer_state: State, telegram: Bot
) -> None:
    seen, storage = Seen(), MemoryStorage()
    # two dispatchers on two clients of the state: two processes as far as the state can tell
    first = build(EventIsolation(state, ttl=5.0), seen, storage)
    second = build(EventIsolation(peer_state, ttl=5.0), seen, storage)
    burst = [message(7, f"m{n}") for n in range(12)]
    feeds = []
    for n, update in enumerate(burst):
        dp = first if n % 2 == 0 else second
        feeds.append(asyncio.ensure_future(dp.feed_update(telegram, update)))
        await asyncio.sleep(0)
    await seen.wait_for(lambda: len(seen.texts(7)) >= 1)
    await asyncio.wait_for(first.feed_update(telegram, message(8, "other")), BOUND)
    assert len(seen.texts(7)) < len(burst)  # chat 8 did not wait for chat 7's burst
    await asyncio.wait_for(asyncio.gather(*feeds), BOUND)
    assert seen.most == {7: 1, 8: 1}
    key = StorageKey(bot_id=telegram.id, chat_id=7, user_id=7)
    assert (await storage.get_data(key))["n"] == len(burst)  # no increment lost
    tokens = seen.tokens(7)
    assert len(tokens) == len(burst)
    assert tokens == sorted(set(tokens))  # fenced: strictly increasing
    # within each client, arrival order (the burst was fed in order, alternating clients)
    handled = seen.texts(7)
    for parity in (0, 1):
        mine = [f"m{n}" for n in range(parity, len(burst), 2)]
        assert [t for t in handled if t in mine] == mine


async def test_a_handler_longer_than_the_ttl_keeps_its_chat(
    state: State, peer_state: State, telegram: Bot
) -> None:
    seen, storage = Seen(), MemoryStorage()
    first = build(EventIsolation(state, ttl=0.5), seen, storage)
    second = build(EventIsolation(peer_state, ttl=0.5), seen, storage)
    slow = asyncio.ensure_future(first.feed_update(telegram, message(9, "slow")))  # 1.5 s
    await seen.wait_for(lambda: seen.texts(9) == ["slow"])
    quick = asyncio.ensure_future(second.feed_update(telegram, message(9, "quick")))
    await asyncio.wait_for(asyncio.gather(slow, quick), BOUND)
    # renewed every ttl/3: the quick one waited three TTLs for the slow one, never overlapping
    assert seen.texts(9) == ["slow", "quick"]
    assert seen.most == {9: 1}


async def test_nothing_is_left_behind_per_chat(state: State, telegram: Bot) -> None:
    if not isinstance(state, LockAdmin):
        pytest.fail(f"{type(state).__name__} cannot list its locks")
    seen, storage = Seen(), MemoryStorage()
    dp = build(EventIsolation(state, ttl=5.0), seen, storage)
    chats = range(1000, 1200)
    await asyncio.wait_for(
        asyncio.gather(*(dp.feed_update(telegram, message(c, "hi")) for c in chats)), 60
    )
    assert len(seen.order) == len(chats)
    assert [info async for info in state.held_locks("aiogram:*")] == []
    gc.collect()
    kept = [
        o for o in gc.get_objects() if isinstance(o, AsyncLock) and o.key.startswith("aiogram:")
    ]
    assert kept == []


async def test_a_lost_lock_cancels_the_handler_and_reaches_aiogram(
    state: State, telegram: Bot
) -> None:
    if not isinstance(state, LockAdmin):
        pytest.fail(f"{type(state).__name__} has no force_release")
    isolation = EventIsolation(state, ttl=0.6)
    dp = Dispatcher(storage=MemoryStorage(), events_isolation=isolation)
    started, cancelled = asyncio.Event(), asyncio.Event()

    @dp.message()
    async def long(message: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    update = message(11, "long")
    feeding = asyncio.ensure_future(dp.feed_update(telegram, update))
    await asyncio.wait_for(started.wait(), BOUND)
    key = isolation.lock_key(StorageKey(bot_id=telegram.id, chat_id=11, user_id=11))
    await state.force_release(key)  # an operator's unlock: the next renewal finds it gone
    await asyncio.wait_for(cancelled.wait(), BOUND)
    # raised by the isolation around aiogram's handling: polling logs it, a webhook answers 500
    with pytest.raises(LockLostError):
        await asyncio.wait_for(feeding, BOUND)


async def test_aiogram_shutdown_leaves_a_given_state_open(state: State, telegram: Bot) -> None:
    isolation = EventIsolation(state, ttl=5.0)
    dp = Dispatcher(events_isolation=isolation)
    ran: list[int | None] = []

    @dp.message()
    async def hello(message: Message) -> None:
        ran.append(isolation_token())

    await dp.feed_update(telegram, message(12, "hi"))
    await dp.emit_shutdown()  # aiogram's shutdown closes its FSM storage and the isolation
    assert ran[0] is not None
    assert isolation_token() is None
    async with AsyncLock(state, "still-open", ttl=5.0) as lock:  # the caller's state is theirs
        assert lock.owned
    owned = EventIsolation.from_url("memory://")  # one made from a URL is the isolation's own
    await owned.close()


def test_bad_arguments_are_named(state: State) -> None:
    with pytest.raises(TypeError, match="asynclock state"):
        EventIsolation("redis://")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl"):
        EventIsolation(state, ttl=0)
    with pytest.raises(ValueError, match="timeout"):
        EventIsolation(state, timeout=-1.0)


@pytest.mark.redis
@pytest.mark.processes
@pytest.mark.timeout(300)
async def test_the_example_counts_a_burst_spread_over_two_processes_without_losing_one(
    prefix: str,
) -> None:
    """``examples/aiogram_isolation_bot.py`` in two processes behind aiogram's own webhook
    handler (answering before handling): a burst of one user's messages, alternately to the two,
    each handler reading the FSM count, working, writing it back. With the isolation the answers
    are 1, 2, ..., 10 (aiogram#1317 loses increments without it)."""
    burst = 10
    async with telegram_api() as api:
        async with (
            bot_processes(
                "telegram-isolation", 2, state_url=REDIS.url, prefix=prefix, api_url=api.url,
                settings={"BOT_DELAY": "0.05", "FSM_REDIS_URL": REDIS.url},
            ) as bots,
            httpx.AsyncClient(timeout=30.0) as client,
        ):  # fmt: skip
            for n in range(burst):
                body = json.loads(message(61, f"m{n}").model_dump_json(exclude_unset=True))
                answer = await client.post(bots.urls[n % 2] + WEBHOOK_PATH, json=body)
                assert answer.status_code == 200  # answered before handling: aiogram's default
            await api.recorder.wait_for(lambda: len(api.recorder.replies) >= burst)
        assert api.recorder.texts("61") == [str(n) for n in range(1, burst + 1)]
