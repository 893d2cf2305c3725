"""A Slack Events API webhook on aiohttp.web, one handler per thread at a time across every worker.

Run it (Redis on 127.0.0.1:6379, or ``ASYNCLOCK_STATE_URL=memory://`` for a single process)::

    python -m examples.aiohttp_bot            # PORT=8080 by default; start several: they share it

The routes and the environment variables are those of ``fastapi_bot.py``: ``POST /slack/events``
does what ``ASYNCLOCK_ROUTE`` says (``durable`` by default: stored in the inbox, then 200),
``POST /slack/events/{durable,sync,background}`` each do theirs, ``GET /stats`` shows this
worker's counts and the deployment's inbox. Several processes can serve one port (the socket is
bound with ``SO_REUSEPORT``), as uvicorn's ``--workers`` do. ``on_startup`` builds the state and
the :class:`~asynclock.EventDispatcher`; ``on_cleanup`` drains the dispatcher, then closes the
state.
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
    ROUTES,
    Answer,
    BadPayload,
    Challenge,
    Journal,
    Settings,
    accept_answer,
    delivery_answer,
    inbox_summary,
    is_redelivery,
    parse_payload,
    state_options,
    submit_answer,
)

if TYPE_CHECKING:
    from asynclock._dispatch.policies import ConflictPolicy

log = logging.getLogger("examples.aiohttp_bot")

BOT = web.AppKey("bot", EventDispatcher)
STATE = web.AppKey("state", State)
JOURNAL = web.AppKey("journal", Journal)
SERVING = web.AppKey("serving", asyncio.Task[None])


def create_app(
    state_url: str = DEFAULT_STATE_URL,
    prefix: str = DEFAULT_PREFIX,
    *,
    route: str = "durable",
    on_lock_conflict: ConflictPolicy = "queue",
    lock_ttl: float = 30.0,
    delay: float = 0.5,
    journal: Journal | None = None,
) -> web.Application:
    """The webhook app (the arguments are those of ``fastapi_bot.create_app``)."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
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

    def respond(answer: Answer) -> web.Response:
        return web.json_response(dict(answer.body), status=answer.status, headers=answer.headers)

    async def sync(request: web.Request) -> web.Response:
        event = await read_event(request)
        if isinstance(event, web.Response):
            return event
        return respond(delivery_answer(event, await request.app[BOT].deliver(event)))

    async def background(request: web.Request) -> web.Response:
        event = await read_event(request)
        if isinstance(event, web.Response):
            return event
        if is_redelivery(request.headers):  # its first delivery may be in progress: no 202
            return respond(delivery_answer(event, await request.app[BOT].deliver(event)))
        return respond(submit_answer(request.app[BOT], event))

    async def durable(request: web.Request) -> web.Response:
        event = await read_event(request)
        if isinstance(event, web.Response):
            return event
        return respond(await accept_answer(request.app[BOT], event))

    async def stats(request: web.Request) -> web.Response:
        """This worker's counts (``worker`` names it) and the deployment's inbox (the state's)."""
        bot = request.app[BOT]
        inbox = await inbox_summary(bot)
        return web.json_response({**work.snapshot(bot), "route": route, "inbox": inbox})

    app = web.Application()
    app[JOURNAL] = work
    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    routes = {"sync": sync, "background": background, "durable": durable}
    app.router.add_post("/slack/events", routes[route])
    for name, endpoint in routes.items():
        app.router.add_post(f"/slack/events/{name}", endpoint)
    app.router.add_get("/stats", stats)
    return app


def app_from_env() -> web.Application:
    """The app as :class:`~examples._slack.Settings` read from the environment configure it."""
    settings = Settings.from_env()
    return create_app(
        settings.state_url,
        settings.prefix,
        route=settings.route,
        on_lock_conflict=settings.on_lock_conflict,
        lock_ttl=settings.lock_ttl,
        journal=Journal(settings.delay, settings.journal_file),
    )


def main() -> None:
    """``python -m examples.aiohttp_bot``: serve on 127.0.0.1:$PORT (8080), port shared."""
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"))
    port = int(os.environ.get("PORT", "8080"))
    # reuse_port: several processes serve one port, the kernel spreading the connections
    web.run_app(app_from_env(), host="127.0.0.1", port=port, reuse_port=True)


if __name__ == "__main__":
    main()
