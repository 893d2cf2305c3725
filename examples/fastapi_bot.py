"""A Slack Events API webhook on FastAPI, one handler per thread at a time across every worker.

Run it (Redis on 127.0.0.1:6379, or ``ASYNCLOCK_STATE_URL=memory://`` for a single process)::

    uvicorn examples.fastapi_bot:app --port 8000 --workers 4

The environment configures it (``examples._slack.Settings``): ``ASYNCLOCK_STATE_URL``,
``ASYNCLOCK_PREFIX``, ``ASYNCLOCK_ROUTE`` (what ``POST /slack/events`` does: ``durable``, the
default, ``sync`` or ``background``), ``ASYNCLOCK_ON_LOCK_CONFLICT`` (default ``queue``),
``ASYNCLOCK_LOCK_TTL``, ``ASYNCLOCK_EXAMPLE_DELAY``, ``ASYNCLOCK_EXAMPLE_JOURNAL``.

* ``POST /slack/events/durable`` (the default of ``POST /slack/events``) stores the event in the
  durable inbox and answers 200 as soon as it is stored: no crash of any process loses it
  after that. The app's own processes drain the inbox (``serve()`` runs in the lifespan), and
  more workers can be started beside them with ``asynclock worker examples.fastapi_bot:bot``.
  A full inbox or an unreachable state answers 503 with ``Retry-After``.
* ``POST /slack/events/sync`` delivers the event (``bot.deliver``) and answers with what
  happened: 200 when it was handled (or is a duplicate of a handled one), **503 with
  ``Retry-After``** when its thread was busy and the policy dropped it, or when it is a
  duplicate of a delivery still in progress (maybe on a worker that died), 500 when the
  handler failed. Only a handled event gets a 2xx; the platform redelivers the rest.
* ``POST /slack/events/background`` submits the event and answers 202 at once; the dispatcher
  refuses ``on_lock_conflict="drop"`` there (answered 500), since a dropped event could no
  longer be answered 503. Shutdown drains every submitted event. A redelivery
  (``X-Slack-Retry-Num``) is delivered and answered as on the sync route: its first delivery
  may still be in progress (in a worker that died), so it never gets an unconditional 202.
* ``GET /stats``: this worker's outcome counts (named by its ``worker`` id) and the
  deployment's inbox depth and lag, read from the state.

The lifespan builds the state and the :class:`~asynclock.EventDispatcher` and closes both on
shutdown; ``async with EventDispatcher(...)`` drains what was submitted before the state closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypedDict

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

import asynclock
from asynclock import Event, EventDispatcher, HandlerContext
from asynclock.metrics import get_metrics, set_metrics
from asynclock.metrics.prometheus import PrometheusMetrics
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
    worker_dispatcher,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock._dispatch.policies import ConflictPolicy

log = logging.getLogger("examples.fastapi_bot")


class BotState(TypedDict):
    """What the lifespan hands to every request (``request.state``)."""

    bot: EventDispatcher


def create_app(
    state_url: str = DEFAULT_STATE_URL,
    prefix: str = DEFAULT_PREFIX,
    *,
    route: str = "durable",
    on_lock_conflict: ConflictPolicy = "queue",
    lock_ttl: float = 30.0,
    delay: float = 0.5,
    journal: Journal | None = None,
    metrics: bool = True,
    serve_inbox: bool = True,
) -> FastAPI:
    """The webhook app.

    Args:
        state_url: where locks and dedupe records live (``asynclock.state_from_url``).
        prefix: the key prefix of this bot's records on a server state.
        route: what ``POST /slack/events`` does: ``"durable"``, ``"sync"`` or ``"background"``.
        on_lock_conflict: what happens to an event whose thread is busy (``"queue"``: waits its
            turn; ``"drop"``: answered 503 on the sync route so the platform redelivers).
        lock_ttl: seconds of each per-thread lock between renewals.
        delay: seconds the example handler pretends to work.
        journal: the handler and its record (tests pass their own to look at it).
        metrics: report asynclock's metrics to a Prometheus registry served on ``/metrics``.
        serve_inbox: drain the durable inbox in this process too (``serve()`` in the lifespan).
    """
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    work = journal if journal is not None else Journal(delay)
    registry = CollectorRegistry()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[BotState]:
        state = asynclock.state_from_url(state_url, **state_options(state_url, prefix))
        # the metrics sink is process-wide: set it for the app's lifetime, then put back
        previous_sink = set_metrics(PrometheusMetrics(registry)) if metrics else get_metrics()
        try:
            # raise_errors=False: a failing handler is an outcome (FAILED -> 500), not a crash
            async with EventDispatcher(
                state, on_lock_conflict=on_lock_conflict, lock_ttl=lock_ttl, raise_errors=False
            ) as bot:

                @bot.on("*")
                async def reply(event: Event, ctx: HandlerContext) -> None:
                    # ctx.token: the fencing token of the thread's lock; a store that remembers
                    # the highest token it saw can refuse a write from a holder that lost it
                    log.info(
                        "handling %s (%s, token %s)", event.message_id, ctx.lock_key, ctx.token
                    )
                    await work.work(event, ctx)

                serving = asyncio.create_task(bot.serve()) if serve_inbox else None
                yield {"bot": bot}
                work.closing.set()
            if serving is not None:  # aclose() stopped it: each key finished its entry in hand
                await serving
            # leaving `async with` awaited bot.aclose(): every submitted event is done
        finally:
            set_metrics(previous_sink)
            await state.aclose()

    app = FastAPI(title="asynclock Slack bot", lifespan=lifespan)

    async def read_event(request: Request) -> Event | JSONResponse:
        work.delivered()
        try:
            parsed = parse_payload(await request.json())
        except (json.JSONDecodeError, UnicodeDecodeError, BadPayload) as error:
            return JSONResponse({"error": str(error)}, status_code=400)
        if isinstance(parsed, Challenge):
            return JSONResponse({"challenge": parsed.value})
        return parsed

    def respond(answer: Answer) -> JSONResponse:
        return JSONResponse(dict(answer.body), answer.status, headers=dict(answer.headers))

    async def sync(request: Request) -> JSONResponse:
        event = await read_event(request)
        if isinstance(event, JSONResponse):
            return event
        return respond(delivery_answer(event, await request.state.bot.deliver(event)))

    async def background(request: Request) -> JSONResponse:
        event = await read_event(request)
        if isinstance(event, JSONResponse):
            return event
        if is_redelivery(request.headers):  # its first delivery may be in progress: no 202
            return respond(delivery_answer(event, await request.state.bot.deliver(event)))
        return respond(submit_answer(request.state.bot, event))

    async def durable(request: Request) -> JSONResponse:
        event = await read_event(request)
        if isinstance(event, JSONResponse):
            return event
        return respond(await accept_answer(request.state.bot, event))

    routes = {"sync": sync, "background": background, "durable": durable}
    app.add_api_route("/slack/events", routes[route], methods=["POST"])
    for name, endpoint in routes.items():
        app.add_api_route(f"/slack/events/{name}", endpoint, methods=["POST"])

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        """Lock wait/hold times, conflicts, renewals, losses and outcomes, for Prometheus."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/stats")
    async def stats(request: Request) -> dict[str, object]:
        """This worker's counts (``worker`` names it) and the deployment's inbox (the state's)."""
        bot: EventDispatcher = request.state.bot
        return {**work.snapshot(bot), "route": route, "inbox": await inbox_summary(bot)}

    return app


def app_from_env() -> FastAPI:
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


#: ``uvicorn examples.fastapi_bot:app``: nothing connects before the lifespan starts
app = app_from_env()


def bot() -> EventDispatcher:
    """A worker's dispatcher: ``asynclock worker examples.fastapi_bot:bot`` drains the inbox."""
    return worker_dispatcher(Settings.from_env())
