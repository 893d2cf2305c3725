"""The example webhook apps over real HTTP on loopback, against Redis.

Both apps (FastAPI under uvicorn, aiohttp under its own server) run in the test's event loop on
a free 127.0.0.1 port, and a real HTTP client (httpx) delivers Slack-style payloads to them.
Handlers are held by the journal's ``gate`` and watched with ``journal.wait_for``, so each
scenario is arranged by waiting for events, never by sleeping: they hold on a loaded machine.
"""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from examples import aiohttp_bot, fastapi_bot
from examples._slack import Journal, Settings
from tests._matrix import REDIS
from tests.integration._servers import bounded, serve_aiohttp, serve_fastapi

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from asynclock._dispatch.policies import ConflictPolicy
    from tests.integration._servers import Running

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

LOCK_TTL = 10.0
EVENTS = "/slack/events"
BACKGROUND = "/slack/events/background"
DURABLE = "/slack/events/durable"
KINDS = ("fastapi", "aiohttp")


def slack(
    ts: str,
    *,
    thread: str | None = None,
    channel: str = "C1",
    text: str = "hello",
    event_type: str = "app_mention",
) -> dict[str, object]:
    """A Slack Events API envelope: ``thread`` None means a top-level message (its own thread)."""
    event: dict[str, object] = {"type": event_type, "channel": channel, "ts": ts, "text": text}
    if thread is not None:
        event["thread_ts"] = thread
    return {"type": "event_callback", "event_id": f"Ev{ts.replace('.', '')}", "event": event}


class Launcher:
    """Starts example apps on the test's Redis namespace (several may share it, as workers do)."""

    def __init__(self, namespace: str) -> None:
        self.prefix = str(REDIS.options(namespace)["prefix"])

    @asynccontextmanager
    async def __call__(
        self,
        kind: str,
        *,
        on_lock_conflict: ConflictPolicy = "drop",
        journal: Journal | None = None,
        delay: float = 0.0,
        route: str = "sync",
    ) -> AsyncIterator[Running]:
        journal = journal if journal is not None else Journal(delay)
        if kind == "fastapi":
            fastapi_app = fastapi_bot.create_app(
                REDIS.url,
                self.prefix,
                route=route,
                on_lock_conflict=on_lock_conflict,
                lock_ttl=LOCK_TTL,
                journal=journal,
            )
            async with serve_fastapi(fastapi_app, journal) as running:
                yield running
        else:
            aiohttp_app = aiohttp_bot.create_app(
                REDIS.url,
                self.prefix,
                route=route,
                on_lock_conflict=on_lock_conflict,
                lock_ttl=LOCK_TTL,
                journal=journal,
            )
            async with serve_aiohttp(aiohttp_app, journal) as running:
                yield running


@pytest.fixture
def launch(namespace: str) -> Launcher:
    return Launcher(namespace)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    chosen: str = request.param
    return chosen


@asynccontextmanager
async def client_of(running: Running) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=running.base_url, timeout=httpx.Timeout(60.0)) as client:
        yield client


def handled_ids(journal: Journal) -> list[str]:
    return [str(h.message_id) for h in journal.handled]


async def wait_until(journal: Journal, condition: Callable[[], bool], what: str) -> None:
    await bounded(journal.wait_for(condition), what)


# -- the basics ------------------------------------------------------------------------------


async def test_url_verification_bad_payloads_and_stats(kind: str, launch: Launcher) -> None:
    async with launch(kind) as running, client_of(running) as client:
        verified = await client.post(EVENTS, json={"type": "url_verification", "challenge": "c-1"})
        assert verified.status_code == 200
        assert verified.json() == {"challenge": "c-1"}
        for body in (b"not json", b"[1, 2]", b'{"event": {"type": "app_mention"}}'):
            bad = await client.post(EVENTS, content=body)
            assert bad.status_code == 400, body
        assert running.journal.handled == []
        ok = await client.post(EVENTS, json=slack("100.1"))
        assert (ok.status_code, ok.json()["outcome"]) == (200, "handled")
        stats = (await client.get("/stats")).json()
        assert stats["handled"] == ["100.1"]
        assert stats["outcomes"]["handled"] == 1


async def test_fastapi_serves_prometheus_metrics(launch: Launcher) -> None:
    async with launch("fastapi") as running, client_of(running) as client:
        ok = await client.post(EVENTS, json=slack("150.1", channel="C9"))
        assert ok.status_code == 200
        scraped = await client.get("/metrics")
        assert scraped.status_code == 200
        text = scraped.text
        assert 'asynclock_lock_acquired_total{contended="no",name="slack"} 1.0' in text
        assert (
            'asynclock_dispatch_outcomes_total{event_type="app_mention",outcome="handled"}' in text
        )
        assert "asynclock_lock_hold_seconds_bucket" in text


async def test_the_event_carries_slack_ids_and_the_handler_gets_a_token(
    kind: str, launch: Launcher
) -> None:
    async with launch(kind) as running, client_of(running) as client:
        top = await client.post(EVENTS, json=slack("200.1", channel="C7"))
        reply = await client.post(EVENTS, json=slack("200.2", thread="200.1", channel="C7"))
        assert top.status_code == reply.status_code == 200
        first, second = running.journal.handled
        # a top-level message is its own thread; a reply shares its parent's lock key
        assert first.lock_key == second.lock_key == "slack:C7:200.1"
        assert first.token is not None
        assert second.token is not None
        assert second.token > first.token
        assert (first.text, second.text) == ("hello", "hello")


# -- serialization and parallelism -----------------------------------------------------------


async def test_concurrent_deliveries_for_one_thread_are_serialized(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.gate = asyncio.Event()
    count = 6
    async with (
        launch(kind, on_lock_conflict="queue", journal=journal) as running,
        client_of(running) as client,
    ):
        posts = [
            asyncio.create_task(client.post(EVENTS, json=slack(f"300.{i}", thread="300.0")))
            for i in range(count)
        ]
        # every delivery reached the app while the first handler holds the thread
        await wait_until(
            journal,
            lambda: journal.deliveries == count and journal.running_total == 1,
            "all deliveries in, one handler running",
        )
        assert journal.most_per_key == 1
        journal.gate.set()
        answers = [await task for task in posts]
        assert [a.status_code for a in answers] == [200] * count
        assert {a.json()["outcome"] for a in answers} <= {"handled", "queued"}
        assert sorted(handled_ids(journal)) == sorted(f"300.{i}" for i in range(count))
        assert journal.most_per_key == 1  # never two handlers for the thread at once
        assert all(h.token is not None for h in journal.handled)
        tokens = [h.token or 0 for h in journal.handled]
        assert tokens == sorted(tokens)  # fencing tokens grow in handling order
        assert len(set(tokens)) == count  # each call under its own, newer lock


async def test_deliveries_for_different_threads_run_in_parallel(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.gate = asyncio.Event()
    count = 4
    async with launch(kind, journal=journal) as running, client_of(running) as client:
        posts = [
            asyncio.create_task(client.post(EVENTS, json=slack(f"400.{i}", channel=f"C{i}")))
            for i in range(count)
        ]
        # only reachable if the four handlers run at the same time
        await wait_until(journal, lambda: journal.running_total == count, "4 handlers at once")
        journal.gate.set()
        answers = [await task for task in posts]
        assert [(a.status_code, a.json()["outcome"]) for a in answers] == [(200, "handled")] * count
        assert journal.most_at_once == count
        assert journal.most_per_key == 1


# -- duplicates ------------------------------------------------------------------------------


async def test_a_duplicate_delivery_is_acknowledged_and_not_handled_twice(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    async with launch(kind, journal=journal) as running, client_of(running) as client:
        first = await client.post(EVENTS, json=slack("500.1"))
        again = await client.post(EVENTS, json=slack("500.1"))
        assert (first.status_code, first.json()["outcome"]) == (200, "handled")
        assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")

        # a redelivery that arrives while the original is still being handled: not done yet (the
        # worker handling it may die), so it is answered 503 until the claim's lease lapses
        journal.gate = asyncio.Event()
        original = asyncio.create_task(client.post(EVENTS, json=slack("500.2")))
        await wait_until(journal, lambda: journal.running_total == 1, "the original running")
        redelivered = await client.post(EVENTS, json=slack("500.2"))
        assert redelivered.status_code == 503, redelivered.text
        assert redelivered.json()["outcome"] == "duplicate"
        assert redelivered.json()["in_progress"] is True
        assert 1 <= int(redelivered.headers["Retry-After"]) <= LOCK_TTL + 1
        journal.gate.set()
        done = await original
        assert (done.status_code, done.json()["outcome"]) == (200, "handled")
        assert handled_ids(journal) == ["500.1", "500.2"]


# -- drop: 503 + Retry-After, and the redelivery is handled -----------------------------------


async def test_busy_thread_under_drop_answers_503_and_the_redelivery_is_handled(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.gate = asyncio.Event()
    async with launch(kind, journal=journal) as running, client_of(running) as client:
        holder = asyncio.create_task(client.post(EVENTS, json=slack("600.1")))
        await wait_until(journal, lambda: journal.running_total == 1, "the holder running")

        busy = await client.post(EVENTS, json=slack("600.2", thread="600.1"))
        assert busy.status_code == 503
        assert busy.json()["outcome"] == "dropped"
        retry_after = int(busy.headers["Retry-After"])
        # an estimate of when the thread frees (no handling seen yet: about a second, rounded
        # up to the next whole-second retry slot), not the lock's TTL of 30 s
        assert 1 <= retry_after <= 3
        assert busy.json()["retry_after"] == retry_after

        journal.gate.set()
        assert (await holder).status_code == 200
        # the platform redelivers: the dropped event was forgotten by dedupe, so it is handled
        later = await client.post(EVENTS, json=slack("600.2", thread="600.1"))
        assert (later.status_code, later.json()["outcome"]) == (200, "handled")
        assert handled_ids(journal) == ["600.1", "600.2"]
        stats = (await client.get("/stats")).json()["outcomes"]
        assert (stats["handled"], stats["dropped"]) == (2, 1)


async def test_a_redelivering_platform_loses_nothing_under_drop(
    kind: str, launch: Launcher
) -> None:
    """Concurrent deliveries to one thread, each redelivered on 503 until acknowledged."""
    journal = Journal()
    journal.gate = asyncio.Event()
    count = 5
    refused: dict[str, int] = {}

    async def platform(client: httpx.AsyncClient, payload: dict[str, object]) -> str:
        event = payload["event"]
        assert isinstance(event, dict)
        ts = str(event["ts"])
        while True:
            answer = await client.post(EVENTS, json=payload)
            if answer.status_code != 503:
                assert answer.status_code == 200
                return str(answer.json()["outcome"])
            assert 1 <= int(answer.headers["Retry-After"]) <= LOCK_TTL
            refused[ts] = refused.get(ts, 0) + 1
            journal.delivered()  # wake the test's wait below
            await asyncio.sleep(0.01)  # a test platform redelivers sooner than Retry-After asks

    async with launch(kind, journal=journal) as running, client_of(running) as client:
        deliveries = [
            asyncio.create_task(platform(client, slack(f"700.{i}", thread="700.0")))
            for i in range(count)
        ]
        # one handler holds the thread; every other delivery has been refused at least once
        await wait_until(
            journal,
            lambda: journal.running_total == 1 and len(refused) == count - 1,
            "one holder and 503s for the others",
        )
        journal.gate.set()
        outcomes = await bounded(asyncio.gather(*deliveries), "every delivery acknowledged")
        del outcomes
        assert sorted(handled_ids(journal)) == sorted(f"700.{i}" for i in range(count))
        assert journal.most_per_key == 1


# -- failures --------------------------------------------------------------------------------


async def test_a_failing_handler_answers_500_and_the_redelivery_is_handled(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.fail_once.add("800.1")
    async with launch(kind, journal=journal) as running, client_of(running) as client:
        failed = await client.post(EVENTS, json=slack("800.1"))
        assert (failed.status_code, failed.json()["outcome"]) == (500, "failed")
        retried = await client.post(EVENTS, json=slack("800.1"))
        assert (retried.status_code, retried.json()["outcome"]) == (200, "handled")
        assert handled_ids(journal) == ["800.1"]


# -- submit: answer at once, drain on shutdown -----------------------------------------------


async def test_background_mode_answers_at_once_and_shutdown_drains(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.gate = asyncio.Event()
    stamps = [f"900.{i}" for i in range(3)] + [f"901.{i}" for i in range(3)]
    payloads = [slack(ts, thread="900.0") for ts in stamps[:3]]  # one busy thread
    payloads += [slack(ts, channel=f"C{i}") for i, ts in enumerate(stamps[3:])]  # three others
    async with launch(kind, on_lock_conflict="queue", journal=journal) as running:
        async with client_of(running) as client:
            for payload in payloads:
                accepted = await client.post(BACKGROUND, json=payload)
                assert accepted.status_code == 202  # while every handler is held
            assert journal.handled == []

        stopping = asyncio.create_task(running.stop())
        await bounded(journal.closing.wait(), "the shutdown to begin")
        assert journal.handled == []  # nothing could finish yet...
        assert not stopping.done()  # ...and the shutdown waits for it
        journal.gate.set()
        await bounded(stopping, "the drained shutdown")
        assert sorted(handled_ids(journal)) == sorted(stamps)
        assert journal.most_per_key == 1
        assert journal.running == {}


async def test_a_background_redelivery_is_answered_after_its_outcome(
    kind: str, launch: Launcher
) -> None:
    # Slack redelivers when the 202 came late: the first delivery may be in progress, maybe in
    # a worker that dies, so the redelivery is not answered 202 at once (#30)
    journal = Journal()
    journal.gate = asyncio.Event()
    payload = slack("950.1")
    retry = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
    async with (
        launch(kind, on_lock_conflict="queue", journal=journal) as running,
        client_of(running) as client,
    ):
        assert (await client.post(BACKGROUND, json=payload)).status_code == 202
        await wait_until(journal, lambda: journal.running_total == 1, "the handler running")
        early = await client.post(BACKGROUND, json=payload, headers=retry)
        assert early.status_code == 503
        assert int(early.headers["Retry-After"]) >= 1
        journal.gate.set()
        await wait_until(journal, lambda: handled_ids(journal) == ["950.1"], "the handling")
        later = await client.post(BACKGROUND, json=payload, headers=retry)
        assert later.status_code == 200  # done: a duplicate, nothing runs again
    assert handled_ids(journal) == ["950.1"]


# -- accept: the durable inbox -----------------------------------------------------------------


async def test_durable_mode_answers_200_once_stored_and_handles_in_order(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.gate = asyncio.Event()  # nothing can finish while the deliveries are answered
    threads = ("700.0", "701.0")
    stamps = {t: [f"{t[:3]}.{i}" for i in range(1, 7)] for t in threads}
    async with (
        launch(kind, on_lock_conflict="queue", journal=journal) as running,
        client_of(running) as client,
    ):
        for i in range(6):
            for thread in threads:
                answer = await client.post(DURABLE, json=slack(stamps[thread][i], thread=thread))
                assert answer.status_code == 200, answer.text
                assert answer.json()["outcome"] == "accepted"
        again = await client.post(DURABLE, json=slack(stamps[threads[0]][0], thread=threads[0]))
        assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
        journal.gate.set()
        await wait_until(journal, lambda: len(journal.handled) == 12, "all 12 handled")
    for thread in threads:
        mine = [str(h.message_id) for h in journal.handled if h.lock_key.endswith(thread)]
        assert mine == stamps[thread]
    assert journal.most_per_key == 1


# -- two workers, one Redis ------------------------------------------------------------------


async def test_a_fastapi_and_an_aiohttp_worker_share_the_thread_locks(launch: Launcher) -> None:
    """Two apps, two dispatchers, two Redis clients: the thread lock still admits one handler."""
    journal = Journal()
    journal.gate = asyncio.Event()
    count = 6
    async with (
        launch("fastapi", on_lock_conflict="queue", journal=journal) as one,
        launch("aiohttp", on_lock_conflict="queue", journal=journal) as two,
        client_of(one) as first,
        client_of(two) as second,
    ):
        posts = [
            asyncio.create_task(
                (first if i % 2 else second).post(EVENTS, json=slack(f"950.{i}", thread="950.0"))
            )
            for i in range(count)
        ]
        await wait_until(
            journal,
            lambda: journal.deliveries == count and journal.running_total == 1,
            "all deliveries in, one handler running",
        )
        journal.gate.set()
        answers = await bounded(asyncio.gather(*posts), "every delivery answered")
        del answers
        assert sorted(handled_ids(journal)) == sorted(f"950.{i}" for i in range(count))
        assert journal.most_per_key == 1


# -- configuration, /stats, the background route under drop -----------------------------------


def test_settings_come_from_the_environment_and_bad_values_are_named() -> None:
    settings = Settings.from_env({})
    assert (settings.route, settings.on_lock_conflict) == ("durable", "queue")
    settings = Settings.from_env(
        {
            "ASYNCLOCK_STATE_URL": "memory://",
            "ASYNCLOCK_ROUTE": "sync",
            "ASYNCLOCK_ON_LOCK_CONFLICT": "drop",
            "ASYNCLOCK_LOCK_TTL": "2.5",
            "ASYNCLOCK_EXAMPLE_JOURNAL": "/tmp/j",
        }
    )
    assert settings == Settings(
        state_url="memory://",
        route="sync",
        on_lock_conflict="drop",
        lock_ttl=2.5,
        journal_file="/tmp/j",
    )
    with pytest.raises(ValueError, match=r"ASYNCLOCK_ROUTE.*'fast'"):
        Settings.from_env({"ASYNCLOCK_ROUTE": "fast"})
    with pytest.raises(ValueError, match=r"ASYNCLOCK_ON_LOCK_CONFLICT.*'wait'"):
        Settings.from_env({"ASYNCLOCK_ON_LOCK_CONFLICT": "wait"})
    with pytest.raises(ValueError, match=r"ASYNCLOCK_LOCK_TTL.*'soon'"):
        Settings.from_env({"ASYNCLOCK_LOCK_TTL": "soon"})


async def test_the_default_route_is_durable_and_stats_show_worker_and_inbox(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    journal.gate = asyncio.Event()  # nothing finishes: the inbox holds what was accepted
    async with (
        launch(kind, on_lock_conflict="queue", journal=journal, route="durable") as running,
        client_of(running) as client,
    ):
        for i in range(3):
            answer = await client.post(EVENTS, json=slack(f"980.{i}", thread="980.0"))
            assert (answer.status_code, answer.json()["outcome"]) == (200, "accepted")
        await wait_until(journal, lambda: journal.running_total == 1, "the first one running")
        stats = (await client.get("/stats")).json()
        assert stats["worker"].endswith(f":{os.getpid()}")
        assert stats["route"] == "durable"
        inbox = stats["inbox"]
        assert (inbox["pending"], inbox["keys"], inbox["dead_letters"]) == (3, 1, 0)
        assert inbox["lag_seconds"] >= 0.0
        journal.gate.set()
        await wait_until(journal, lambda: len(journal.handled) == 3, "all three handled")


async def test_the_background_route_refuses_drop_with_a_non_2xx(
    kind: str, launch: Launcher
) -> None:
    journal = Journal()
    async with launch(kind, journal=journal) as running, client_of(running) as client:
        refused = await client.post(BACKGROUND, json=slack("990.1"))
        assert refused.status_code == 500
        assert "on_lock_conflict='drop'" in refused.json()["error"]
        assert journal.handled == []
