"""``examples/supersede_bot.py``: a follow-up cuts the streaming reply short and is answered with
it in view, on memory and on Redis (the app's own lifespan builds and closes everything)."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import httpx
import pytest

from examples.supersede_bot import FakeModel, create_app
from tests._matrix import REDIS, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.timeout(60)

SOON = 10.0


@asynccontextmanager
async def client(url: str, grace: float | None) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(
        url, supersede_grace=grace, model=FakeModel(0.05), prefix=f"ex-{uuid.uuid4().hex}:"
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bot") as http:
            yield http


async def streaming(http: httpx.AsyncClient, chat: str) -> None:
    """Until the first reply of ``chat`` has posted a chunk (the caller bounds the wait)."""
    while True:
        replies = (await http.get(f"/chats/{chat}")).json()
        if replies and replies[0]["text"]:
            return
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("url", ["memory://", "redis"])
@pytest.mark.parametrize("grace", [0.0, None])
async def test_a_follow_up_cuts_the_reply_short_and_is_answered_with_it(
    url: str, grace: float | None
) -> None:
    if url == "redis":
        require(REDIS)
        url = REDIS.url
    async with client(url, grace) as http:
        first = asyncio.ensure_future(
            http.post("/messages", json={"chat": "c1", "id": "m1", "text": "hi"})
        )
        await asyncio.wait_for(streaming(http, "c1"), SOON)
        follow_up = {"chat": "c1", "id": "m2", "text": "actually, my order 123 is late"}
        second = await asyncio.wait_for(http.post("/messages", json=follow_up), SOON)
        answered = await asyncio.wait_for(first, SOON)
        replies = (await http.get("/chats/c1")).json()
        bad = await http.post("/messages", json={"chat": "c1"})
    assert (answered.status_code, answered.json()) == (200, {"outcome": "superseded"})
    assert (second.status_code, second.json()) == (200, {"outcome": "queued"})
    cut, full = replies
    assert (cut["answering"], cut["status"]) == ("m1", "cut short")
    assert (full["answering"], full["status"]) == ("m2", "done")
    assert full["seen"] == ["hi", "actually, my order 123 is late"]
    assert "order 123" in full["text"]
    assert bad.status_code == 400
