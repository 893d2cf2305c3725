"""A Slack Events API webhook on aiohttp.web, one handler per thread at a time across every worker.

Run it (Redis on 127.0.0.1:6379, or ``ASYNCLOCK_STATE_URL=memory://`` for a single process)::

    python -m examples.aiohttp_bot            # PORT=8080 by default

The routes are those of ``fastapi_bot.py``: ``POST /slack/events`` answers with the outcome
(503 + ``Retry-After`` for a busy thread under ``drop``), ``POST /slack/events/background``
submits and answers 202 at once, ``POST /slack/events/durable`` stores the event in the durable
inbox and answers 200 (the recommended production route; ``serve()`` runs in the app, and
``asynclock worker examples.fastapi_bot:bot`` adds workers), ``GET /stats``. ``on_startup`` builds the state and the
:class:`~asynclock.EventDispatcher`; ``on_cleanup`` drains the dispatcher, then closes the state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import TYPE_CHECKING

from aiohttp import web

import asynclock
from asynclock import Event, EventDispatcher, HandlerContext, State
from examples._slack import (
    DEFAULT_PREFIX,
    DEFAULT_STATE_URL,
    BadPayload,
    Challenge,
    Journal,
    accept_answer,
    answer_for,
    parse_payload,
    state_options,
)

if TYPE_CHECKING:
    from asynclock._dispatch import ConflictPolicy

log = logging.getLogger("examples.aiohttp_bot")

BOT = web.AppKey("bot", EventDispatcher)
STATE = web.AppKey("state", State)
JOURNAL = web.AppKey("journal", Journal)
SERVING = web.AppKey("serving", asyncio.Task[None])


def create_app(
    state_url: str = DEFAULT_STATE_URL,
    prefix: str = DEFAULT_PREFIX,
    *,
    on_lock_conflict: ConflictPolicy = "drop",
    lock_ttl: float = 30.0,
    delay: float = 0.5,
    journal: Journal | None = None,
) -> web.Application:
    """The webhook app (the arguments are those of ``fastapi_bot.create_app``)."""
    work = journal if journal is not None else Journal(delay)

    async def start(app: web.Application) -> None:
        state = asynclock.state_from_url(state_url, **state_options(state_url, prefix))
        # raise_errors=False: a failing handler is an outcome (FAILED -> 500), not a crash
        bot = EventDispatcher(
            state, on_lock_conflict=on_lock_conflict, lock_ttl=lock_ttl, raise_errors=False
        )

        @bot.on("*")
        async def reply(event: Event, ctx: HandlerContext) -> None:
            # ctx.token: the fencing token of the thread's lock; a store that remembers the
            # highest token it saw can refuse a write from a holder that lost the lock
            log.info("handling %s (%s, token %s)", event.message_id, ctx.lock_key, ctx.token)
            await work.work(event, ctx)

        app[STATE] = state
        app[BOT] = bot
        app[SERVING] = asyncio.create_task(bot.serve())  # drain the durable inbox here too

    async def stop(app: web.Application) -> None:
        work.closing.set()
        try:
            await app[BOT].aclose()  # drains: every submitted event is done after this
            await app[SERVING]  # aclose() stopped serve(): each key finished its entry in hand
        finally:
            await app[STATE].aclose()

    async def read_event(request: web.Request) -> Event | web.Response:
        work.delivered()
        try:
            parsed = parse_payload(await request.json())
        except (json.JSONDecodeError, UnicodeDecodeError, BadPayload) as error:
            return web.json_response({"error": str(error)}, status=400)
        if isinstance(parsed, Challenge):
            return web.json_response({"challenge": parsed.value})
        return parsed

    async def slack_events(request: web.Request) -> web.Response:
        event = await read_event(request)
        if isinstance(event, web.Response):
            return event
        bot = request.app[BOT]
        outcome = await bot.dispatch(event)
        answer = await answer_for(bot, event, outcome)
        return web.json_response(dict(answer.body), status=answer.status, headers=answer.headers)

    async def slack_events_background(request: web.Request) -> web.Response:
        event = await read_event(request)
        if isinstance(event, web.Response):
            return event
        try:
            request.app[BOT].submit(event)
        except RuntimeError:  # shutting down: the platform will redeliver
            return web.json_response(
                {"error": "shutting down"}, status=503, headers={"Retry-After": "1"}
            )
        return web.json_response({"accepted": event.message_id}, status=202)

    async def slack_events_durable(request: web.Request) -> web.Response:
        event = await read_event(request)
        if isinstance(event, web.Response):
            return event
        answer = await accept_answer(request.app[BOT], event)
        return web.json_response(dict(answer.body), status=answer.status, headers=answer.headers)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(work.snapshot(request.app.get(BOT)))

    app = web.Application()
    app[JOURNAL] = work
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/slack/events", slack_events)
    app.router.add_post("/slack/events/background", slack_events_background)
    app.router.add_post("/slack/events/durable", slack_events_durable)
    app.router.add_get("/stats", stats)
    return app


def main() -> None:
    """``python -m examples.aiohttp_bot``: serve on 127.0.0.1:$PORT (8080)."""
    logging.basicConfig(level=logging.INFO)
    web.run_app(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))


if __name__ == "__main__":
    main()
