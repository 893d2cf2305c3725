"""A Slack Bolt (``AsyncApp``) bot on aiohttp: store each event, acknowledge, answer in its thread.

Run it (Redis on 127.0.0.1:6379; Slack's signing secret and bot token from the environment)::

    SLACK_SIGNING_SECRET=... SLACK_BOT_TOKEN=xoxb-... python -m examples.slack_bolt_bot

``POST /slack/events`` is Bolt's endpoint: Bolt checks the request signature, then
:class:`~asynclock.integrations.slack_bolt.SlackEventsMiddleware` stores each Events API
delivery in the durable inbox (``mode="accept"``) and answers 200 within Slack's 3 seconds;
``serve()`` (here, and in any ``asynclock worker examples.slack_bolt_bot:worker`` beside it)
answers each event in its thread, one at a time per thread, in order. A redelivery
(``X-Slack-Retry-Num``) is a duplicate and answered 200 without running anything twice. Both
read ``ASYNCLOCK_STATE_URL``, ``ASYNCLOCK_PREFIX``, ``SLACK_BOT_TOKEN`` and ``SLACK_API_URL``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

import asynclock
from asynclock import Event, EventDispatcher, HandlerContext, PolicyName, State
from asynclock.integrations.slack_bolt import Mode, SlackEventsMiddleware

log = logging.getLogger("examples.slack_bolt_bot")

DEFAULT_STATE_URL = os.environ.get("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
DEFAULT_PREFIX = os.environ.get("ASYNCLOCK_PREFIX", "slack-bolt-bot:")
#: the Web API's base URL (Slack's own unless ``SLACK_API_URL`` says otherwise)
DEFAULT_API_URL = os.environ.get("SLACK_API_URL", AsyncWebClient.BASE_URL)

BOT = web.AppKey("bot", EventDispatcher)
STATE = web.AppKey("state", State)
SERVING = web.AppKey("serving", asyncio.Task[None])
MIDDLEWARE = web.AppKey("middleware", SlackEventsMiddleware)


def _text_of(event: Event) -> str:
    inner = event.raw.get("event")
    text = inner.get("text") if isinstance(inner, Mapping) else None
    return text if isinstance(text, str) else ""


def build_dispatcher(
    state: State,
    client: AsyncWebClient,
    *,
    delay: float = 0.0,
    on_lock_conflict: PolicyName = "queue",
    lock_ttl: float = 30.0,
) -> EventDispatcher:
    """The bot's dispatcher and its one handler: reply in the event's thread."""
    bot = EventDispatcher(
        state, on_lock_conflict=on_lock_conflict, lock_ttl=lock_ttl, raise_errors=False
    )

    @bot.on("app_mention")
    async def reply(event: Event, ctx: HandlerContext) -> None:
        if delay:
            await asyncio.sleep(delay)  # the bot's "work"
        # ctx.token, the thread lock's fencing token, travels with the write: a store that
        # remembers the highest token it saw refuses a late write of a holder that lost the lock
        await client.chat_postMessage(
            channel=event.channel_id,
            thread_ts=event.thread_id,
            text=f"re: {_text_of(event)}",
            metadata={"event_type": "asynclock", "event_payload": {"token": ctx.token}},
        )

    return bot


def create_app(
    state_url: str = DEFAULT_STATE_URL,
    prefix: str = DEFAULT_PREFIX,
    *,
    signing_secret: str | None = None,
    token: str | None = None,
    api_url: str = DEFAULT_API_URL,
    mode: Mode = "accept",
    on_lock_conflict: PolicyName = "queue",
    delay: float = 0.0,
    serve: bool = True,
    lock_ttl: float = 30.0,
) -> web.Application:
    """The aiohttp app serving Bolt on ``POST /slack/events``.

    Args:
        state_url: where the inbox, locks and dedupe records live (shared by every process).
        prefix: the key prefix of this bot's records on the server.
        signing_secret: Slack's signing secret (default ``$SLACK_SIGNING_SECRET``).
        token: the bot token (default ``$SLACK_BOT_TOKEN``).
        api_url: the Web API's base URL (tests point it at a stand-in on loopback).
        mode: ``"accept"`` (durable), ``"submit"`` or ``"dispatch"``: see the middleware.
        on_lock_conflict: ``"queue"`` or ``"drop"`` (with ``mode="dispatch"``, a busy
            thread's event is answered 503 and Slack redelivers it).
        delay: seconds the handler pretends to work.
        serve: drain the durable inbox in this process too.
        lock_ttl: seconds of each thread's lock between renewals, and of an event's claim: a
            process that died mid-event holds its thread and its event that long.
    """
    client = AsyncWebClient(token=token or os.environ.get("SLACK_BOT_TOKEN"), base_url=api_url)
    bolt = AsyncApp(
        signing_secret=signing_secret or os.environ.get("SLACK_SIGNING_SECRET"),
        client=client,
    )

    async def start(app: web.Application) -> None:
        options = {} if state_url.startswith("memory:") else {"prefix": prefix}
        state = asynclock.state_from_url(state_url, **options)
        bot = build_dispatcher(
            state, client, delay=delay, on_lock_conflict=on_lock_conflict, lock_ttl=lock_ttl
        )
        middleware = SlackEventsMiddleware(bot, mode=mode)
        bolt.use(middleware)
        app[STATE], app[BOT], app[MIDDLEWARE] = state, bot, middleware
        if serve:
            app[SERVING] = asyncio.create_task(bot.serve())

    async def stop(app: web.Application) -> None:
        try:
            await app[BOT].aclose()  # drains submitted events, stops serve()
            if SERVING in app:
                await app[SERVING]
        finally:
            await app[STATE].aclose()

    async def slack_events(request: web.Request) -> web.Response:
        return await to_aiohttp_response(await bolt.async_dispatch(await to_bolt_request(request)))

    app = web.Application()
    app.router.add_post("/slack/events", slack_events)
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def worker() -> EventDispatcher:
    """``asynclock worker examples.slack_bolt_bot:worker``: more processes draining the inbox."""
    state = asynclock.state_from_url(DEFAULT_STATE_URL, prefix=DEFAULT_PREFIX)
    client = AsyncWebClient(token=os.environ.get("SLACK_BOT_TOKEN"), base_url=DEFAULT_API_URL)
    return build_dispatcher(state, client)


def main() -> None:
    """``python -m examples.slack_bolt_bot``: serve on 127.0.0.1:$PORT (3000)."""
    logging.basicConfig(level=logging.INFO)
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "3000")))


if __name__ == "__main__":
    main()
