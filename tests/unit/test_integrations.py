"""The framework adapters' mappings and argument checks (no server, no network).

What they do with real frameworks over HTTP is in ``tests/integration/test_slack_bolt.py`` and
``tests/integration/test_aiogram.py``.
"""

from __future__ import annotations

import asyncio
import json
import pickle

import pytest
from aiogram import Bot, Dispatcher
from aiogram.dispatcher.event.bases import UNHANDLED
from aiogram.dispatcher.middlewares.user_context import UserContextMiddleware
from aiogram.types import ErrorEvent, Message, Update
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from asynclock import Event, EventDispatcher, HandlerContext, MemoryState, Outcome, state_from_url
from asynclock.integrations.aiogram import (
    InboxRequestHandler,
    UpdateFeeder,
    UpdateInProgressError,
    UpdateMiddleware,
    telegram_event,
)
from asynclock.integrations.slack_bolt import SlackEventsMiddleware, slack_event
from asynclock.integrations.taskiq import LockMiddleware, TaskAlreadyQueuedError, UniqueMiddleware
from tests._helpers import LocksOnly


def envelope(event: dict[str, object], **extra: object) -> dict[str, object]:
    return {"type": "event_callback", "event_id": "Ev9", "team_id": "T0", "event": event, **extra}


class TestSlackEvent:
    def test_a_reply_is_serialized_on_its_thread_and_deduped_by_event_id(self) -> None:
        body = envelope({"type": "message", "channel": "C1", "ts": "2.2", "thread_ts": "2.1"})
        event = slack_event(body)
        assert event is not None
        assert (event.type, event.thread_key, event.dedupe_key) == (
            "message",
            "slack:C1:2.1",
            "Ev9",
        )
        assert event.raw is body

    def test_a_top_level_message_is_its_own_thread(self) -> None:
        event = slack_event(envelope({"type": "app_mention", "channel": "C1", "ts": "3.1"}))
        assert event is not None
        assert event.thread_key == "slack:C1:3.1"

    def test_a_reaction_takes_its_item_channel(self) -> None:
        item = {"type": "message", "channel": "C4", "ts": "4.1"}
        event = slack_event(envelope({"type": "reaction_added", "item": item, "event_ts": "4.5"}))
        assert event is not None
        assert event.channel_id == "C4"
        assert event.thread_id == "Ev9"  # no ts of its own: serialized on its event id

    def test_an_event_without_a_channel_is_keyed_on_its_event_id(self) -> None:
        event = slack_event(envelope({"type": "team_join", "user": {"id": "U1"}}))
        assert event is not None
        assert event.thread_key == "slack:T0:Ev9"

    @pytest.mark.parametrize(
        "body",
        [
            {"type": "url_verification", "challenge": "c"},
            {"type": "event_callback", "event": {"type": "message"}},  # no event_id
            {"type": "event_callback", "event_id": "Ev1", "event": "not an object"},
            {"command": "/deploy", "text": "now"},
        ],
    )
    def test_anything_else_is_not_an_event(self, body: dict[str, object]) -> None:
        assert slack_event(body) is None


class TestSlackEventsMiddleware:
    def test_it_needs_a_dispatcher(self) -> None:
        with pytest.raises(TypeError, match="needs an EventDispatcher, got None"):
            SlackEventsMiddleware(None)  # type: ignore[arg-type]

    def test_an_unknown_mode_is_named(self) -> None:
        bot = EventDispatcher(MemoryState())
        with pytest.raises(
            ValueError, match="mode must be one of submit, accept, dispatch, got 'later'"
        ):
            SlackEventsMiddleware(bot, mode="later")  # type: ignore[arg-type]

    def test_accept_needs_a_state_with_the_inbox(self) -> None:
        # every built-in state has the inbox: a third-party state with the locks only
        bot = EventDispatcher(LocksOnly(), on_lock_conflict="queue")
        with pytest.raises(TypeError, match=r"needs a state with the durable inbox.*LocksOnly"):
            SlackEventsMiddleware(bot, mode="accept")
        assert SlackEventsMiddleware(bot, mode="submit").mode == "submit"

    def test_submit_refuses_a_dispatcher_that_drops(self) -> None:
        # a busy thread's event would be dropped after Slack got its 200 (#14)
        with pytest.raises(ValueError, match="on_lock_conflict='drop'"):
            SlackEventsMiddleware(EventDispatcher(MemoryState()))
        for mode in ("accept", "dispatch"):
            assert SlackEventsMiddleware(EventDispatcher(MemoryState()), mode=mode).mode == mode

    def test_repr_and_properties(self) -> None:
        bot = EventDispatcher(MemoryState())
        middleware = SlackEventsMiddleware(bot, mode="accept")
        assert (middleware.bot, middleware.mode, middleware.redeliveries) == (bot, "accept", 0)
        assert repr(middleware) == "<SlackEventsMiddleware mode=accept redeliveries=0>"


def update(payload: dict[str, object]) -> Update:
    return Update.model_validate({"update_id": 11, **payload})


def topic_message(thread: int | None) -> dict[str, object]:
    message: dict[str, object] = {
        "message_id": 1,
        "date": 0,
        "chat": {"id": -100, "type": "supergroup", "is_forum": True},
        "text": "hi",
    }
    if thread is not None:
        message.update(message_thread_id=thread, is_topic_message=True)
    return {"message": message}


class TestTelegramEvent:
    def test_a_chat_is_one_conversation_unless_per_thread(self) -> None:
        u = update(topic_message(5))
        context = UserContextMiddleware.resolve_event_context(u)
        per_chat = telegram_event(u, context, bot_id=42)
        per_topic = telegram_event(u, context, bot_id=42, per_thread=True)
        assert (per_chat.thread_key, per_topic.thread_key) == (
            "telegram:-100:chat",
            "telegram:-100:5",
        )
        assert per_chat.dedupe_key == per_topic.dedupe_key == "42:11"

    def test_the_main_thread_of_a_forum_is_the_chat_conversation(self) -> None:
        u = update(topic_message(None))
        context = UserContextMiddleware.resolve_event_context(u)
        assert telegram_event(u, context, bot_id=1, per_thread=True).thread_id == "chat"

    def test_an_update_without_a_chat_is_keyed_on_its_sender(self) -> None:
        query = {"id": "q1", "from": {"id": 9, "is_bot": False, "first_name": "u"}, "query": "x"}
        u = update({"inline_query": {**query, "offset": ""}})
        event = telegram_event(u, UserContextMiddleware.resolve_event_context(u), bot_id=1)
        assert (event.type, event.channel_id) == ("inline_query", "user:9")
        assert event.raw["update_id"] == 11


class TestUpdateMiddleware:
    def test_it_needs_a_dispatcher(self) -> None:
        with pytest.raises(TypeError, match="needs an EventDispatcher, got 'bot'"):
            UpdateMiddleware("bot")  # type: ignore[arg-type]

    def test_an_empty_context_key_is_refused(self) -> None:
        with pytest.raises(ValueError, match="context_key"):
            UpdateMiddleware(EventDispatcher(MemoryState()), context_key="")

    async def test_its_dispatcher_refuses_events_no_update_belongs_to(self) -> None:
        bot = EventDispatcher(MemoryState())
        UpdateMiddleware(bot)
        stray = Event("message", "telegram", "1", "chat", "1:1")
        with pytest.raises(RuntimeError, match="no update in flight belongs to"):
            await bot.dispatch(stray)


async def _not_called() -> BoltResponse:
    raise AssertionError("an Events API delivery must not go on to Bolt's listeners")


def bolt_request(body: dict[str, object]) -> AsyncBoltRequest:
    """What Bolt's adapters build from an HTTP request (signature already checked by Bolt)."""
    return AsyncBoltRequest(body=json.dumps(body), headers={"content-type": "application/json"})


class TestSlackAnswers:
    async def test_a_full_inbox_is_answered_503_with_retry_after(self) -> None:
        bot = EventDispatcher(MemoryState(), max_pending=1)
        middleware = SlackEventsMiddleware(bot, mode="accept")
        answers = []
        for n in range(2):  # nobody serves: the second finds the thread's inbox full
            inner: dict[str, object] = {"type": "app_mention", "channel": "C1", "ts": f"1.{n}"}
            inner["thread_ts"] = "1.0"
            body = envelope(inner)
            body["event_id"] = f"Ev{n}"
            resp = BoltResponse(status=200, body="")
            answer = await middleware.async_process(
                req=bolt_request(body), resp=resp, next=_not_called
            )
            assert answer is not None
            answers.append(answer)
        assert [a.status for a in answers] == [200, 503]
        assert int(answers[1].headers["retry-after"][0]) >= 1
        assert "inbox full" in answers[1].body

    async def test_an_unreachable_state_is_answered_503_quickly(self) -> None:
        state = state_from_url("redis://127.0.0.1:1/0", connect_timeout=0.5, op_timeout=0.5)
        middleware = SlackEventsMiddleware(EventDispatcher(state), mode="accept")
        body = envelope({"type": "app_mention", "channel": "C1", "ts": "1.1"})
        try:
            answer = await asyncio.wait_for(
                middleware.async_process(
                    req=bolt_request(body), resp=BoltResponse(status=200, body=""), next=_not_called
                ),
                10,
            )
        finally:
            await state.aclose()
        assert answer is not None
        assert (answer.status, answer.headers["retry-after"]) == (503, ["1"])

    async def test_other_requests_go_on_to_bolt(self) -> None:
        middleware = SlackEventsMiddleware(EventDispatcher(MemoryState(), on_lock_conflict="queue"))
        passed = BoltResponse(status=200, body="from the listener")

        async def listener_chain() -> BoltResponse:
            return passed

        command = bolt_request({"command": "/deploy", "text": "now"})
        answer = await middleware.async_process(
            req=command, resp=BoltResponse(status=200, body=""), next=listener_chain
        )
        assert answer is passed


class TestAiogramErrors:
    async def test_a_failing_handler_reaches_aiogram_and_its_redelivery_runs(self) -> None:
        dp = Dispatcher()
        bot = EventDispatcher(MemoryState())
        dp.update.outer_middleware(UpdateMiddleware(bot))
        tokens: list[int | None] = []
        errors: list[str] = []

        @dp.message()
        async def handler(message: Message, asynclock: HandlerContext) -> None:
            tokens.append(asynclock.token)
            if len(tokens) == 1:
                raise RuntimeError("boom")

        @dp.error()
        async def on_error(event: ErrorEvent) -> bool:
            errors.append(str(event.exception))
            return True

        telegram = Bot(token="42:UNIT-TEST")  # no call leaves: the handler sends nothing
        try:
            delivery = update(topic_message(None))
            await dp.feed_update(telegram, delivery)
            await dp.feed_update(telegram, delivery)  # Telegram's redelivery: handled this time
            await dp.feed_update(telegram, delivery)  # and now a duplicate
        finally:
            await telegram.session.close()
        assert errors == ["boom"]
        assert len(tokens) == 2
        assert (bot.stats[Outcome.FAILED], bot.stats[Outcome.HANDLED]) == (1, 1)
        assert bot.stats[Outcome.DUPLICATE] == 1

    async def test_a_redelivery_of_an_update_in_progress_is_a_503_not_a_200(self) -> None:
        # Telegram's retry of an update still being handled (maybe by a process that died):
        # a 200 would make Telegram forget it (#30); aiohttp turns the error into a 503
        dp = Dispatcher()
        bot = EventDispatcher(MemoryState(), lock_ttl=10.0)
        dp.update.outer_middleware(UpdateMiddleware(bot))
        running, finish = asyncio.Event(), asyncio.Event()

        @dp.message()
        async def handler(message: Message) -> None:
            running.set()
            await finish.wait()

        swallowed: list[BaseException] = []

        @dp.error()
        async def log_and_swallow(event: ErrorEvent) -> bool:  # what many bots register
            swallowed.append(event.exception)
            return True

        telegram = Bot(token="42:UNIT-TEST")
        try:
            delivery = update(topic_message(None))
            first = asyncio.ensure_future(dp.feed_update(telegram, delivery))
            await asyncio.wait_for(running.wait(), 10)
            with pytest.raises(UpdateInProgressError) as in_progress:
                await dp.feed_update(telegram, delivery)
            finish.set()
            await asyncio.wait_for(first, 10)
            assert await dp.feed_update(telegram, delivery) is UNHANDLED  # done: a plain 200
        finally:
            await telegram.session.close()
        assert swallowed == []  # no error handler can turn the 503 into a 200
        answer = in_progress.value
        assert answer.status == 503
        assert 1 <= int(answer.headers["Retry-After"]) <= 11
        assert (answer.update_id, bot.stats[Outcome.DUPLICATE]) == (11, 2)


class TestAiogramDurableWebhookArguments:
    def test_the_request_handler_needs_a_dispatcher_and_a_bot(self) -> None:
        bot = EventDispatcher(MemoryState(), on_lock_conflict="queue")
        telegram = Bot(token="42:UNIT-TEST")
        with pytest.raises(TypeError, match="needs an EventDispatcher"):
            InboxRequestHandler("bot", telegram)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="needs an aiogram Bot"):
            InboxRequestHandler(bot, "telegram")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="secret_token"):
            InboxRequestHandler(bot, telegram, secret_token="")
        assert repr(InboxRequestHandler(bot, telegram)) == (
            "<InboxRequestHandler bot_id=42 per_thread=False>"
        )

    def test_the_feeder_needs_a_dispatcher_an_aiogram_dispatcher_and_a_bot(self) -> None:
        bot = EventDispatcher(MemoryState(), on_lock_conflict="queue")
        telegram = Bot(token="42:UNIT-TEST")
        with pytest.raises(TypeError, match="needs an aiogram Dispatcher"):
            UpdateFeeder(bot, "dp", telegram)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="context_key"):
            UpdateFeeder(bot, Dispatcher(), telegram, context_key="")
        feeder = UpdateFeeder(bot, Dispatcher(), telegram)
        assert feeder.bot is bot


class TestTaskiqMiddlewareArguments:
    def test_bad_prefixes_and_labels_are_named(self) -> None:
        state = MemoryState()
        with pytest.raises(TypeError, match="prefix must be a str"):
            LockMiddleware(state, prefix=None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="label"):
            UniqueMiddleware(state, label="")
        with pytest.raises(ValueError, match="ttl"):
            UniqueMiddleware(state, ttl=-1)

    def test_a_refusal_pickles_with_its_fields(self) -> None:
        refused = TaskAlreadyQueuedError("report:monday", "t-1", 12.5)
        again = pickle.loads(pickle.dumps(refused))
        assert (again.key, again.task_id, again.retry_after) == ("report:monday", "t-1", 12.5)
        assert str(again) == str(refused)
