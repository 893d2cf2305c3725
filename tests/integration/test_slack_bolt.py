"""asynclock.integrations.slack_bolt in a real Bolt ``AsyncApp`` over real HTTP, against Redis.

The app is ``examples/slack_bolt_bot.py``: Bolt's aiohttp adapter, request signature
verification on, its Web API client pointed at the Slack stand-in on loopback (Bolt's
``auth.test`` and the bot's ``chat.postMessage`` land there; nothing leaves the machine).
Deliveries are Events API envelopes signed as Slack signs them. Every wait is for a reply or an
answer, bounded; none is a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from asynclock import Outcome, RedisState
from examples import slack_bolt_bot
from tests._matrix import REDIS
from tests.integration._processes import (
    asynclock_worker,
    bot_processes,
    deliver_each_twice,
    held,
    holder_pid,
    tally,
)
from tests.integration._redelivery import SLACK_RETRIES, redeliver
from tests.integration._standins import (
    BOT_TOKEN,
    SIGNING_SECRET,
    Recorder,
    StandIn,
    serve_app,
    slack_api,
    slack_headers,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from aiohttp import web

    from asynclock import EventDispatcher, PolicyName
    from asynclock.integrations.slack_bolt import Mode, SlackEventsMiddleware

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

PATH = "/slack/events"


def envelope(event_id: str, ts: str, *, thread: str | None = None, channel: str = "C1") -> bytes:
    """An Events API ``app_mention`` delivery; ``thread`` None: a top-level message."""
    event: dict[str, object] = {
        "type": "app_mention",
        "channel": channel,
        "user": "U1",
        "ts": ts,
        "text": event_id,
    }
    if thread is not None:
        event["thread_ts"] = thread
    body = {"type": "event_callback", "team_id": "T0", "event_id": event_id, "event": event}
    return json.dumps(body).encode()


async def deliver(
    client: httpx.AsyncClient, url: str, body: bytes, *, retry: int | None = None
) -> httpx.Response:
    return await client.post(url + PATH, content=body, headers=slack_headers(body, retry=retry))


@pytest.fixture
async def api() -> AsyncIterator[StandIn]:
    async with slack_api() as standin:
        yield standin


class Served:
    """One app in the test's loop: its URL, dispatcher, middleware, and an HTTP client."""

    def __init__(self, url: str, app: web.Application, client: httpx.AsyncClient) -> None:
        self.url = url
        self.client = client
        self.bot: EventDispatcher = app[slack_bolt_bot.BOT]
        self.middleware: SlackEventsMiddleware = app[slack_bolt_bot.MIDDLEWARE]


@asynccontextmanager
async def served(
    prefix: str,
    api: StandIn,
    *,
    mode: Mode = "submit",
    on_lock_conflict: PolicyName = "queue",
    delay: float = 0.02,
) -> AsyncIterator[Served]:
    app = slack_bolt_bot.create_app(
        REDIS.url,
        prefix,
        signing_secret=SIGNING_SECRET,
        token=BOT_TOKEN,
        api_url=api.url,
        mode=mode,
        on_lock_conflict=on_lock_conflict,
        delay=delay,
    )
    async with serve_app(app) as url, httpx.AsyncClient(timeout=30.0) as client:
        yield Served(url, app, client)


def replies_in(recorder: Recorder, conversation: str) -> list[str]:
    return [text.removeprefix("re: ") for text in recorder.texts(conversation)]


async def test_a_bad_signature_is_refused_and_nothing_is_handled(prefix: str, api: StandIn) -> None:
    async with served(prefix, api) as app:
        body = envelope("EvBad", "1.1")
        forged = slack_headers(body, secret="not-the-signing-secret")
        refused = await app.client.post(app.url + PATH, content=body, headers=forged)
        unsigned = await app.client.post(app.url + PATH, content=body)
        assert (refused.status_code, unsigned.status_code) == (401, 401)
        good = await deliver(app.client, app.url, envelope("EvGood", "2.1"))
        assert good.status_code == 200
        await app.bot.aclose()  # everything submitted is done
        # the refused deliveries never reached the dispatcher: one event, handled
        assert replies_in(api.recorder, "C1:2.1") == ["EvGood"]
        assert sum(app.bot.stats.values()) == 1


async def test_a_burst_in_one_thread_is_answered_once_each_in_order(
    prefix: str, api: StandIn
) -> None:
    count = 8
    async with served(prefix, api, mode="submit", delay=0.05) as app:
        # each delivery is acknowledged at once (200), long before its handler ran
        for n in range(count):
            answer = await deliver(app.client, app.url, envelope(f"Ev{n}", f"1.{n}", thread="1.0"))
            assert answer.status_code == 200
        other = await deliver(app.client, app.url, envelope("EvOther", "5.0", channel="C2"))
        assert other.status_code == 200
        await api.recorder.wait_for(lambda: len(api.recorder.replies) == count + 1)
        await app.bot.aclose()
        assert replies_in(api.recorder, "C1:1.0") == [f"Ev{n}" for n in range(count)]
        tokens = [r.token for r in api.recorder.replies if r.conversation == "C1:1.0"]
        assert None not in tokens
        assert tokens == sorted(t for t in tokens if t is not None)
        assert len(set(tokens)) == count  # one lock per handling: strictly increasing
        assert app.bot.stats[Outcome.HANDLED] + app.bot.stats[Outcome.QUEUED] == count + 1


async def test_retries_are_answered_after_their_outcome_and_handled_once(
    prefix: str, api: StandIn
) -> None:
    async with served(prefix, api, mode="submit", delay=0.5) as app:
        body = envelope("EvRetry", "3.1")
        first = await deliver(app.client, app.url, body)
        assert first.status_code == 200  # submitted: answered before the handler ran
        # Slack's retry while the first handling is in progress (Slack got no answer in time):
        # not 200, or Slack would forget an event whose handler may die (#30)
        early = await deliver(app.client, app.url, body, retry=1)
        assert early.status_code == 503
        assert int(early.headers["Retry-After"]) >= 1
        await api.recorder.wait_for(lambda: len(api.recorder.replies) == 1)
        # once it is done, a retry is a plain duplicate: 200, nothing runs again
        later = [await deliver(app.client, app.url, body, retry=n) for n in (2, 3)]
        assert [r.status_code for r in later] == [200, 200]
        await app.bot.aclose()  # everything submitted is done
        assert replies_in(api.recorder, "C1:3.1") == ["EvRetry"]
        assert app.middleware.redeliveries == 3
        assert app.bot.stats[Outcome.DUPLICATE] == 3
        assert app.bot.stats[Outcome.HANDLED] == 1


async def test_dispatch_mode_answers_503_for_a_busy_thread_and_handles_the_retry(
    prefix: str, api: StandIn
) -> None:
    async with served(prefix, api, mode="dispatch", on_lock_conflict="drop", delay=0.5) as app:
        first_body = envelope("EvA", "4.1")
        first = asyncio.create_task(deliver(app.client, app.url, first_body))
        key = "slack:C1:4.1"
        # wait until the first handler holds the thread's lock (it holds it for 0.5 s)
        while await app.bot.state.inspect(key) is None:
            assert not first.done(), first
            await asyncio.sleep(0.01)
        busy_body = envelope("EvB", "4.2", thread="4.1")
        busy = await deliver(app.client, app.url, busy_body)
        assert busy.status_code == 503
        assert int(busy.headers["Retry-After"]) >= 1
        assert (await first).status_code == 200
        redelivered = await deliver(app.client, app.url, busy_body, retry=1)
        assert redelivered.status_code == 200
        assert replies_in(api.recorder, "C1:4.1") == ["EvA", "EvB"]
        assert app.bot.stats[Outcome.DROPPED] == 1


def thread_of(t: int) -> str:
    return f"7{t}.0"


def event_of(t: int, n: int) -> bytes:
    return envelope(f"Ev{t}-{n}", f"7{t}.{n + 1}", thread=thread_of(t))


def expected(threads: int, per_thread: int) -> dict[str, list[str]]:
    return {f"C1:{thread_of(t)}": [f"Ev{t}-{n}" for n in range(per_thread)] for t in range(threads)}


@pytest.mark.processes
async def test_two_processes_sharing_redis_lose_nothing_and_reply_once_in_order(
    prefix: str, api: StandIn
) -> None:
    threads, per_thread = 4, 5
    async with (
        bot_processes("slack", 2, state_url=REDIS.url, prefix=prefix, api_url=api.url) as bots,
        httpx.AsyncClient(timeout=30.0) as client,
    ):

        async def send(url: str, t: int, n: int, retry: int | None) -> int:
            return (await deliver(client, url, event_of(t, n), retry=retry)).status_code

        sent = await deliver_each_twice(bots.urls, threads, per_thread, send)
        await api.recorder.wait_for(lambda: len(api.recorder.replies) >= sent)
    # both processes shut down cleanly: nothing more can arrive
    figures, got = tally(api.recorder, expected(threads, per_thread), redeliveries=sent)
    print(f"slack, 2 processes: {figures}")
    assert got == expected(threads, per_thread)
    assert (figures.replies, figures.duplicates, figures.lost) == (sent, 0, 0)


@pytest.mark.processes
async def test_events_acknowledged_by_a_process_killed_after_the_ack_are_not_lost(
    prefix: str, api: StandIn
) -> None:
    threads, per_thread = 3, 4
    async with httpx.AsyncClient(timeout=30.0) as client:
        # a web process that stores and acknowledges, and is killed before anyone drained
        async with bot_processes(
            "slack", 1, state_url=REDIS.url, prefix=prefix, api_url=api.url, serve=False
        ) as web:
            for t in range(threads):
                for n in range(per_thread):
                    answer = await deliver(client, web.urls[0], event_of(t, n))
                    assert answer.status_code == 200
            await web.kill(0)
        assert api.recorder.replies == []
        # a worker started afterwards (the command line, as in production) answers every
        # acknowledged event, in order
        env = {
            "ASYNCLOCK_STATE_URL": REDIS.url,
            "ASYNCLOCK_PREFIX": prefix,
            "SLACK_BOT_TOKEN": BOT_TOKEN,
            "SLACK_API_URL": api.url,
        }
        async with asynclock_worker("examples.slack_bolt_bot:worker", env):
            await api.recorder.wait_for(lambda: len(api.recorder.replies) >= threads * per_thread)
    figures, got = tally(api.recorder, expected(threads, per_thread), redeliveries=0)
    print(f"slack, web process killed after the ack: {figures}")
    assert got == expected(threads, per_thread)
    assert (figures.duplicates, figures.lost) == (0, 0)


@pytest.mark.processes
@pytest.mark.parametrize("mode", ["submit", "dispatch", "accept"])
async def test_a_redelivery_after_the_handling_process_died_is_handled(
    prefix: str, api: StandIn, mode: Mode
) -> None:
    """The process handling an event is SIGKILLed mid-handler; Slack retries it at the other
    process (#30). No retry is answered 2xx while the dead process's claim is leased (``submit``,
    ``dispatch``: 503 + ``Retry-After``), or the event is stored (``accept``: 200, and the inbox
    hands it to a live worker); either way it is handled, once."""
    body = envelope("EvKill", "8.1")
    state = RedisState.from_url(REDIS.url, prefix=prefix)
    settings = {"BOT_MODE": mode, "BOT_LOCK_TTL": "3"}
    slow, quick = {"BOT_DELAY": "60"}, {"BOT_DELAY": "0.02"}
    if mode == "accept":
        quick["BOT_SERVE"] = "0"  # only the slow process drains: it is the one handling
    try:
        async with (
            bot_processes(
                "slack", 2, state_url=REDIS.url, prefix=prefix, api_url=api.url,
                settings=settings, each=[slow, quick],
            ) as bots,
            httpx.AsyncClient(timeout=30.0) as client,
        ):  # fmt: skip
            first = asyncio.ensure_future(deliver(client, bots.urls[0], body))
            if mode == "accept":  # the only process draining holds the thread: it is handling
                await held(state, "slack:C1:8.1")
            else:
                assert await holder_pid(state, "slack:C1:8.1") == bots.processes[0].pid
            await bots.kill(0)  # mid-handler
            with contextlib.suppress(httpx.TransportError):  # dispatch: no answer ever came
                await first
            answers = await redeliver(
                lambda n: deliver(client, bots.urls[1], body, retry=n),
                retries=SLACK_RETRIES,
                honour_retry_after=True,
            )
            if mode == "accept":
                assert answers == ["200"]  # stored: the inbox delivers it again, not Slack
                env = {
                    "ASYNCLOCK_STATE_URL": REDIS.url,
                    "ASYNCLOCK_PREFIX": prefix,
                    "SLACK_BOT_TOKEN": BOT_TOKEN,
                    "SLACK_API_URL": api.url,
                }
                async with asynclock_worker("examples.slack_bolt_bot:worker", env):
                    await api.recorder.wait_for(lambda: len(api.recorder.replies) == 1, 120)
            else:
                assert answers[0] == "503", answers  # the dead process's claim is leased
                assert answers[-1] == "200", answers  # the retry after the lease ran it
    finally:
        await state.aclose()
    print(f"slack {mode}, handling process killed: Slack's retries answered {answers}")
    assert replies_in(api.recorder, "C1:8.1") == ["EvKill"]
