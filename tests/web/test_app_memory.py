"""The dashboard's app where the backend does not matter (on ``MemoryState``, or on states made
for the test): what appears when a state reports more, one read for many viewers, mounting in
FastAPI, HTTP details, a state that does not answer, and bad arguments."""

from __future__ import annotations

import asyncio
import logging
import re
import subprocess
import sys
from typing import TYPE_CHECKING, NamedTuple

import pytest
from fastapi import FastAPI

import asynclock.web
from asynclock import MemoryState, state_from_url
from asynclock.web import Dashboard, dashboard
from tests._helpers import LocksOnly
from tests.web._helpers import accept, card, client, csrf_of, dead_letter, headers, key_of, row

if TYPE_CHECKING:
    from asynclock.state._protocol import InboxKey


class LaterKey(NamedTuple):
    """An ``InboxKey`` with the facts the inbox is about to report (holder, attempt, retry,
    parked), under names the dashboard looks for."""

    key: str
    pending: int
    oldest_age: float
    dead: int
    holder: str | None
    attempt: int | None
    retry_in: float | None
    parked: bool


class Reporting(MemoryState):
    """A MemoryState whose ``inbox_keys`` reports the later fields, and which can discard."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.discarded: list[str] = []

    async def inbox_keys(self) -> list[InboxKey]:
        self.reads += 1
        found = await super().inbox_keys()
        extended = []
        for k in found:
            if k.key.endswith("T1"):
                extended.append(LaterKey(*k[:4], "host9:4242:7f:ab", 3, None, False))
            elif k.key.endswith("T2"):
                extended.append(LaterKey(*k[:4], None, None, 42.0, False))
            else:
                extended.append(LaterKey(*k[:4], None, None, None, True))
        return extended  # type: ignore[return-value]

    async def inbox_discard(self, key: str) -> int:
        self.discarded.append(key)
        return 2


class FourFields(NamedTuple):
    """An ``InboxKey`` as states reported it before retries and parking."""

    key: str
    pending: int
    oldest_age: float
    dead: int


class BeforeRetries(MemoryState):
    """A state whose keys have four fields, as states reported them before retries and
    parking (a custom backend of then)."""

    async def inbox_keys(self) -> list[InboxKey]:
        return [FourFields(*k[:4]) for k in await super().inbox_keys()]  # type: ignore[misc]


async def test_columns_appear_when_the_state_reports_them() -> None:
    plain = BeforeRetries()
    await accept(plain, "T1", 1)
    async with client(dashboard(plain)) as http:
        page = (await http.get("/")).text
    for column in ("<th>attempt</th>", "retrying until", "parked keys"):
        assert column not in page
    assert "<th>holder</th>" in page  # from the locks: every built-in state lists them

    state = Reporting()
    for thread in ("T1", "T2", "T3"):
        await accept(state, thread, 1)
    async with client(dashboard(state)) as http:
        page = (await http.get("/")).text
    assert "<th>holder</th>" in page
    assert "<th>attempt</th>" in page
    assert "<th>retrying until</th>" in page
    held = row(page, key_of("T1"))
    assert "handling" in held
    assert 'title="host9:4242:7f:ab">host9:4242</td>' in held
    assert '<td class="num">3</td>' in held
    assert "retrying" in row(page, key_of("T2"))
    assert "(in 4" in row(page, key_of("T2"))  # 42 s from now
    assert "parked" in row(page, key_of("T3"))
    assert card(page, "parked keys") == "1"
    assert card(page, "retrying") == "1"


async def test_discard_is_offered_when_the_state_can_discard(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plain = MemoryState()  # every built-in state can discard (InboxState.inbox_discard)
    await dead_letter(plain, "T1", "m")
    async with client(dashboard(plain, allow_actions=True)) as http:
        page = (await http.get("/")).text
        assert 'data-action="requeue"' in page
        assert 'data-action="discard"' in page
        answer = await http.post(
            "/api/discard", json={"key": key_of("T1")}, headers=headers(csrf_of(page))
        )
        assert answer.status_code == 200
        assert answer.json()["count"] == 1
    assert await plain.inbox_dead_letters(key_of("T1")) == []
    state = Reporting()
    await dead_letter(state, "T1", "m")
    async with client(dashboard(state, allow_actions=True)) as http:
        page = (await http.get("/")).text
        assert 'data-action="discard"' in page
        with caplog.at_level(logging.WARNING, logger="asynclock"):
            answer = await http.post(
                "/api/discard", json={"key": key_of("T1")}, headers=headers(csrf_of(page))
            )
        assert answer.status_code == 200
        assert answer.json()["count"] == 2
    assert state.discarded == [key_of("T1")]
    assert any("discard by 127.0.0.1" in r.getMessage() for r in caplog.records)


async def test_many_viewers_share_one_read() -> None:
    state = Reporting()
    await accept(state, "T1", 1)
    app = dashboard(state, refresh=60.0)
    async with client(app) as http:
        answers = await asyncio.gather(*(http.get("/api/refresh") for _ in range(20)))
        assert {a.status_code for a in answers} == {200}
        assert state.reads == 1
        await http.get("/")
        assert state.reads == 1  # still younger than 0.75 * refresh


async def test_mounted_in_a_fastapi_app() -> None:
    state = MemoryState()
    await dead_letter(state, "T1", "m")
    app = FastAPI()
    app.mount("/ops/asynclock", dashboard(state, allow_actions=True))
    async with client(app) as http:  # type: ignore[arg-type]
        for path in ("/ops/asynclock/", "/ops/asynclock"):
            page = await http.get(path, follow_redirects=True)  # Starlette adds the slash
            assert page.status_code == 200
            assert 'data-root="/ops/asynclock"' in page.text
        script = re.search(r'src="(/ops/asynclock/static/dashboard\.js\?v=\w+)"', page.text)
        assert script is not None
        js = await http.get(script[1])
        assert js.status_code == 200
        assert js.headers["content-type"].startswith("text/javascript")
        css = await http.get("/ops/asynclock/static/dashboard.css")
        assert css.status_code == 200
        refreshed = await http.get("/ops/asynclock/api/refresh")
        assert key_of("T1") in refreshed.json()["fragments"]["dead"]
        answer = await http.post(
            "/ops/asynclock/api/requeue",
            json={"key": key_of("T1")},
            headers=headers(csrf_of(page.text)),
        )
        assert answer.status_code == 200
        assert answer.json()["count"] == 1


async def test_http_details() -> None:
    app = dashboard(MemoryState())
    async with client(app) as http:
        page = await http.get("/")
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp
        assert "script-src 'self'" in csp
        assert "frame-ancestors 'none'" in csp
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["cache-control"] == "no-store"
        assert not re.search(r"(src|href)=\"(https?:)?//", page.text)  # nothing from elsewhere
        head = await http.head("/")
        assert head.status_code == 200
        assert head.content == b""
        assert (await http.get("/nope")).status_code == 404
        wrong = await http.get("/api/requeue")
        assert wrong.status_code == 405
        assert wrong.headers["allow"] == "POST"
        assert (await http.post("/", content=b"x")).status_code == 405
        big = await http.post(
            "/api/requeue",
            content=b"x" * 20_000,
            headers=headers(csrf_of(page.text)),
        )
        assert big.status_code == 403  # read-only: refused before the body is read
    acting = dashboard(MemoryState(), allow_actions=True)
    async with client(acting) as http:
        token = csrf_of((await http.get("/")).text)
        big = await http.post("/api/requeue", content=b"x" * 20_000, headers=headers(token))
        assert big.status_code == 413
        bad = await http.post("/api/requeue", content=b"[1]", headers=headers(token))
        assert bad.status_code == 400
        empty = await http.post("/api/requeue", content=b'{"key": ""}', headers=headers(token))
        assert empty.status_code == 400


async def test_a_state_with_locks_only_shows_what_it_has() -> None:
    state = LocksOnly()
    app = dashboard(state, allow_actions=True)
    async with client(app) as http:
        page = (await http.get("/")).text
        assert "This state has no durable inbox." in page
        assert "This state cannot list its locks." in page
        assert 'data-action="' not in page
        answer = await http.post("/api/requeue", json={"key": "k"}, headers=headers(csrf_of(page)))
        assert answer.status_code == 501
        assert "LocksOnly cannot requeue" in answer.json()["error"]


async def test_hosts_limits_the_host_names_answered() -> None:
    app = dashboard(MemoryState(), hosts={"127.0.0.1:8765", "localhost:8765"})
    async with client(app) as http:
        assert (await http.get("/")).status_code == 200
        assert (await http.get("/", headers={"host": "localhost:8765"})).status_code == 200
        rebound = await http.get("/api/refresh", headers={"host": "evil.example:8765"})
        assert rebound.status_code == 421
        assert "fragments" not in rebound.text


async def test_lifespan_is_acknowledged() -> None:
    app = dashboard(MemoryState())
    inbox: asyncio.Queue[dict[str, object]] = asyncio.Queue()
    sent: list[dict[str, object]] = []
    for kind in ("lifespan.startup", "lifespan.shutdown"):
        inbox.put_nowait({"type": kind})

    async def send(message: object) -> None:
        sent.append(message)  # type: ignore[arg-type]

    await app({"type": "lifespan"}, inbox.get, send)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_a_state_that_does_not_answer_shows_why_without_its_password() -> None:
    state = state_from_url("redis://:hunter2secret@127.0.0.1:1/0", prefix="asynclock-test:down:")
    try:
        async with client(dashboard(state)) as http:
            page = await http.get("/")
            assert page.status_code == 200
            assert "The state is not answering" in page.text
            assert "StateUnavailableError" in page.text
            assert "hunter2secret" not in page.text
            assert "redis://:***@127.0.0.1:1/0" in page.text
            refreshed = await http.get("/api/refresh")
            assert "hunter2secret" not in refreshed.text
    finally:
        await state.aclose()


def test_bad_arguments_are_refused_with_their_value() -> None:
    state = MemoryState()
    with pytest.raises(ValueError, match=r"refresh must be at least 0\.2 seconds, got 0\.01"):
        dashboard(state, refresh=0.01)
    with pytest.raises(ValueError, match="history must be > 0 seconds, got -1"):
        dashboard(state, history=-1)
    with pytest.raises(TypeError, match="allow_actions must be a bool, got 'yes'"):
        dashboard(state, allow_actions="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="origins must be a collection"):
        dashboard(state, origins="https://ops.example.com")
    app = dashboard(state, origins=["https://ops.example.com"])
    assert isinstance(app, Dashboard)
    assert repr(app) == f"<Dashboard of {state!r}, read-only>"


async def test_an_allowed_origin_may_act() -> None:
    state = MemoryState()
    await dead_letter(state, "T1", "m")
    app = dashboard(state, allow_actions=True, origins=["https://ops.example.com"])
    async with client(app) as http:
        token = csrf_of((await http.get("/")).text)
        answer = await http.post(
            "/api/requeue",
            json={"key": key_of("T1")},
            headers=headers(token, "https://ops.example.com"),
        )
        assert answer.status_code == 200
        other = await http.post(
            "/api/requeue",
            json={"key": key_of("T1")},
            headers=headers(token, "https://ops.example.org"),
        )
        assert other.status_code == 403


class Slow(MemoryState):
    """A state whose listing takes 0.4 s (as a Redis one of a few hundred keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def inbox_keys(self) -> list[InboxKey]:
        self.reads += 1
        await asyncio.sleep(0.4)
        return await super().inbox_keys()


async def test_a_slow_state_is_read_less_often() -> None:
    state = Slow()
    await accept(state, "T1", 1)
    app = dashboard(state, refresh=0.2)  # a read may be reused for 0.15 s, or 5x its time
    async with client(app) as http:
        page = (await http.get("/")).text
        assert state.reads == 1
        assert "read every" in page  # the page says why it refreshes more slowly
        # past 0.75 * refresh, well within 5x the read's 0.4 s (room for a loaded machine)
        await asyncio.sleep(0.3)
        await http.get("/api/refresh")
        assert state.reads == 1


def test_the_app_needs_nothing_beyond_asynclock() -> None:
    code = (
        "import sys, asynclock.web; "
        "print(sorted(m for m in ('uvicorn', 'starlette', 'fastapi', 'httpx') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
    assert Dashboard.__module__ == "asynclock.web"
    assert asynclock.web.__all__ == ("Dashboard", "dashboard")


def test_the_forms_of_a_due_time() -> None:
    from asynclock.web._snapshot import key_row

    now = 1_800_000_000.0
    for due in (42.0, now + 42.0, (now + 42.0) * 1000):
        found = LaterKey("k", 1, 1.0, 0, None, None, due, False)
        row, fields = key_row(found, now)
        assert row.retry_at == pytest.approx(now + 42.0), due
        assert "retry" in fields
    row, fields = key_row(InboxKeyNow("k", 1, 1.0, 0), now)
    assert row.retry_at is None
    assert fields == frozenset()


class InboxKeyNow(NamedTuple):
    key: str
    pending: int
    oldest_age: float
    dead: int
