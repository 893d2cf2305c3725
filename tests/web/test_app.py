"""The dashboard's ASGI app on every backend, without a browser (httpx's ASGI transport).

What the page shows of pending events, dead letters and locks; the actions, their guard (read-only
by default, CSRF token, origin) and their log; a dead letter's payload only when asked for; many
keys paged, sorted and filtered. ``test_browser.py`` drives the same page in Chromium.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from typing import TYPE_CHECKING

from asynclock import AsyncLock, LockNotOwnedError

if TYPE_CHECKING:
    import pytest

    from asynclock.state import State
from asynclock.web import dashboard
from tests._helpers import eventually
from tests.web._helpers import (
    BASE,
    Worker,
    accept,
    card,
    client,
    csrf_of,
    dead_letter,
    headers,
    key_of,
    row,
)


async def _page(app: object, query: str = "") -> str:
    async with client(app) as http:  # type: ignore[arg-type]
        answer = await http.get(f"/?{query}")
        assert answer.status_code == 200
        return answer.text


async def test_accepted_events_show_with_their_counts(state: State, peer_state: State) -> None:
    await accept(peer_state, "T1", 3)
    await accept(peer_state, "T2", 1)
    async with AsyncLock(peer_state, key_of("T2"), ttl=30.0) as holder:  # as a worker would
        page = await _page(dashboard(state))
    assert re.search(r'<td class="num">3</td>', row(page, key_of("T1")))
    assert "waiting" in row(page, key_of("T1"))  # no worker holds it
    held = row(page, key_of("T2"))
    assert re.search(r'<td class="num">1</td>', held)
    assert "handling" in held
    assert f'title="{holder.owner}"' in held
    assert card(page, "keys with work") == "2"
    assert card(page, "pending events") == "4"
    assert card(page, "dead letters") == "0"


async def test_a_refresh_answers_fresh_fragments(state: State, peer_state: State) -> None:
    app = dashboard(state, refresh=0.2)
    await accept(peer_state, "T1", 1)
    async with client(app) as http:
        first = (await http.get("/api/refresh")).json()["fragments"]
        assert set(first) == {"status", "totals", "chart", "keys", "dead", "locks"}
        assert re.search(r'<td class="num">1</td>', row(first["keys"], key_of("T1")))
        await accept(peer_state, "T1", 2, first=1)

        async def three() -> bool:
            keys = (await http.get("/api/refresh")).json()["fragments"]["keys"]
            return '<td class="num">3</td>' in row(keys, key_of("T1"))

        # a read is reused for 5x its time: on a shared Redis whose keyspace is large (the
        # listings SCAN it all), a second or so per read, so seconds between reads
        await eventually(three, within=20.0, interval=0.05)


async def test_a_dead_letter_shows_its_error_and_its_payload_only_when_asked(
    state: State, peer_state: State
) -> None:
    await dead_letter(peer_state, "T9", "poison", raw={"card": "4111-secret-payload"})
    app = dashboard(state)
    async with client(app) as http:
        page = (await http.get("/")).text
        assert "ValueError: boom poison" in page
        assert card(page, "dead letters") == "1"
        assert "4111-secret-payload" not in page
        refreshed = (await http.get("/api/refresh")).text
        assert "4111-secret-payload" not in refreshed
        entry = re.search(r'data-payload-id="(\d+)"', page)
        assert entry is not None
        answer = await http.get("/api/payload", params={"key": key_of("T9"), "id": entry[1]})
        assert answer.status_code == 200
        assert answer.headers["cache-control"] == "no-store"
        assert "4111-secret-payload" in answer.json()["payload"]
        missing = await http.get("/api/payload", params={"key": key_of("T9"), "id": "999999"})
        assert missing.status_code == 404
    async with client(dashboard(state, payloads=False)) as http:
        page = (await http.get("/")).text
        assert "data-payload-id" not in page
        answer = await http.get("/api/payload", params={"key": key_of("T9"), "id": entry[1]})
        assert answer.status_code == 403
        assert "4111-secret-payload" not in answer.text


async def test_read_only_refuses_every_action(
    state: State, peer_state: State, caplog: pytest.LogCaptureFixture
) -> None:
    await dead_letter(peer_state, "T1", "m")
    app = dashboard(state)
    async with client(app) as http:
        page = (await http.get("/")).text
        assert 'data-action="requeue"' not in page
        assert "read-only" in page
        token = csrf_of(page)
        with caplog.at_level(logging.WARNING, logger="asynclock"):
            for action in ("requeue", "discard", "unlock"):
                answer = await http.post(
                    f"/api/{action}", json={"key": key_of("T1")}, headers=headers(token)
                )
                assert answer.status_code == 403, action
                assert "read-only" in answer.json()["error"]
    assert [f.dead for f in await state.inbox_keys() if f.key == key_of("T1")] == [1]  # type: ignore[attr-defined]
    refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refused) == 3
    assert all("127.0.0.1" in message for message in refused)


async def test_an_action_needs_the_token_and_the_same_origin(
    state: State, peer_state: State
) -> None:
    await dead_letter(peer_state, "T1", "m")
    app = dashboard(state, allow_actions=True)
    body = json.dumps({"key": key_of("T1")})
    async with client(app) as http:
        token = csrf_of((await http.get("/")).text)
        refused = {
            "no token": headers("", BASE) | {"x-csrf-token": ""},
            "a wrong token": headers("x" + token),
            "another origin": headers(token, "http://evil.example"),
            "a sibling port": headers(token, "http://127.0.0.1:9999"),
            "no origin at all": headers(token, None),
            "a null origin": headers(token, "null"),
            "a form post": headers(token) | {"content-type": "text/plain"},
        }
        for what, sent in refused.items():
            answer = await http.post("/api/requeue", content=body, headers=sent)
            assert answer.status_code == 403, what
        assert [f.dead for f in await state.inbox_keys() if f.key == key_of("T1")] == [1]  # type: ignore[attr-defined]
        by_referer = headers(token, None) | {"referer": f"{BASE}/?q=T1"}
        answer = await http.post("/api/requeue", content=body, headers=by_referer)
        assert answer.status_code == 200, answer.text
        assert answer.json()["count"] == 1


async def test_requeue_puts_the_dead_letter_back_for_a_worker(
    state: State, peer_state: State, caplog: pytest.LogCaptureFixture
) -> None:
    await dead_letter(peer_state, "T1", "again")
    app = dashboard(state, allow_actions=True)
    async with client(app) as http:
        page = (await http.get("/")).text
        assert 'data-action="requeue"' in page
        with caplog.at_level(logging.WARNING, logger="asynclock"):
            answer = await http.post(
                "/api/requeue", json={"key": key_of("T1")}, headers=headers(csrf_of(page))
            )
        assert answer.status_code == 200
        assert answer.json() == {
            "message": f"requeued 1 dead letter(s) of {key_of('T1')!r}",
            "count": 1,
        }
        page = (await http.get("/")).text  # an action makes the next refresh read anew
        assert card(page, "dead letters") == "0"
        assert card(page, "pending events") == "1"
    logged = [r.getMessage() for r in caplog.records if "requeue by" in r.getMessage()]
    assert len(logged) == 1
    assert "127.0.0.1" in logged[0]
    assert key_of("T1") in logged[0]
    async with Worker(peer_state) as worker:
        worker.failing = False

        async def handled() -> bool:
            return worker.handled == ["again"]

        await eventually(handled, within=15.0)


async def test_force_unlock_releases_only_the_holder_that_was_shown(
    state: State, peer_state: State, caplog: pytest.LogCaptureFixture
) -> None:
    app = dashboard(state, allow_actions=True)

    async def as_alice(scope: dict[str, object], receive: object, send: object) -> None:
        # what an authentication middleware of the host app leaves in the scope
        await app({**scope, "user": "alice"}, receive, send)  # type: ignore[arg-type]

    lock = AsyncLock(peer_state, "stuck:1", ttl=30.0)
    await lock.acquire()
    try:
        async with client(as_alice) as http:  # type: ignore[arg-type]
            page = (await http.get("/")).text
            token = re.search(
                r'data-action="unlock" data-key="stuck:1"[^>]*data-token="(\d+)"', page
            )
            assert token is not None
            assert token[1] == str(lock.token)
            assert card(page, "locks held") == "1"
            csrf = csrf_of(page)
            caplog.set_level(logging.WARNING, logger="asynclock")
            stale = await http.post(
                "/api/unlock",
                json={"key": "stuck:1", "token": int(token[1]) - 1},
                headers=headers(csrf),
            )
            assert stale.status_code == 409
            assert await state.inspect("stuck:1") is not None
            answer = await http.post(
                "/api/unlock", json={"key": "stuck:1", "token": token[1]}, headers=headers(csrf)
            )
            assert answer.status_code == 200, answer.text
            assert await state.inspect("stuck:1") is None
            again = await http.post("/api/unlock", json={"key": "stuck:1"}, headers=headers(csrf))
            assert again.status_code == 404
    finally:
        with contextlib.suppress(LockNotOwnedError):  # force-released: nothing left to release
            await lock.release()
    logged = [r.getMessage() for r in caplog.records if "unlock by" in r.getMessage()]
    assert len(logged) == 3  # every try is logged: refused as stale, done, found free
    assert all(m.startswith("asynclock dashboard: unlock by alice at 127.0.0.1") for m in logged)
    assert "changed hands" in logged[0]
    assert "force-released 'stuck:1'" in logged[1]
    assert "not held any more" in logged[2]


async def test_many_keys_are_paged_sorted_by_age_and_filtered(
    state: State, peer_state: State
) -> None:
    for n in range(120):
        await accept(peer_state, f"K{n:03d}", 1)
    app = dashboard(state)
    first = await _page(app)
    rows = re.findall(r'<tr data-key="slack:C1:(K\d+)">', first.split('<section id="dead">')[0])
    assert len(rows) == 50
    assert rows[:3] == ["K000", "K001", "K002"]  # the oldest work first
    assert "page 1 of 3 (120 keys)" in first
    last = await _page(app, "kp=3")
    assert len(re.findall(r'<tr data-key="slack:C1:K', last.split('<section id="dead">')[0])) == 20
    past = await _page(app, "kp=99")  # clamped to the last page, never an empty one
    assert "page 3 of 3" in past
    # the keys' table only: a backend that hands each accepted key out at once (Redis) holds
    # its lock for the hand-out, so the locks' table lists the same keys
    filtered = _keys_section(await _page(app, "q=k11"))
    assert sorted(re.findall(r'<tr data-key="slack:C1:(K\d+)">', filtered)) == [
        f"K11{n}" for n in range(10)
    ]
    by_key = _keys_section(await _page(app, "sort=key&kp=3"))
    assert re.findall(r'<tr data-key="slack:C1:(K\d+)">', by_key)[-1] == "K119"


def _keys_section(page: str) -> str:
    """The page's table of keys with work (not the dead letters' or the locks' tables)."""
    return page.split('<section id="keys">', 1)[1].split("</section>", 1)[0]
