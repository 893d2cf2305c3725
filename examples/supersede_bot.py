"""A chat bot that streams a model's reply, and stops it when the user sends a follow-up.

The user sends "hi"; the bot starts streaming an answer; two seconds later the user sends
"actually, my order 123 is late". With ``on_lock_conflict="supersede"`` the running reply is
interrupted (its ``ctx.superseded`` is set; with ``supersede_grace`` its task is cancelled a bit
later) and the newest message is answered with the whole burst in view (``ctx.skipped``): one
reply, to what the user means now. Across processes too: the interruption reaches the worker that
streams by the state's push (Redis pub/sub, PostgreSQL NOTIFY, MySQL's ear).

The model is a fake (no network): it streams a canned answer word by word. Run it::

    uvicorn examples.supersede_bot:app --port 8000                      # memory://, one process
    ASYNCLOCK_STATE_URL=redis://127.0.0.1:6379/0 uvicorn examples.supersede_bot:app --workers 4

    curl -s localhost:8000/messages -d '{"chat": "c1", "id": "m1", "text": "hi"}' &
    sleep 1
    curl -s localhost:8000/messages -d '{"chat": "c1", "id": "m2", "text": "actually, my order 123 is late"}'
    curl -s localhost:8000/chats/c1    # m1's reply cut short, m2's complete, written for both

* ``POST /messages`` (``{"chat", "id", "text"}``) delivers the message (``bot.deliver``) and
  answers with its outcome once the reply that covers it is done: 200 for ``handled``,
  ``queued``, ``superseded`` (its reply was cut short by a newer message, which was answered
  with it in view) and ``skipped``; 500 when the reply failed (the platform retries).
* ``GET /chats/{chat}``: the replies posted so far (in memory of this process: a real bot posts
  them to its platform).
"""

from __future__ import annotations

import asyncio
import os
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

import asynclock
from asynclock import Event, EventDispatcher, HandlerContext

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@dataclass
class Reply:
    """One reply the bot posted, chunk by chunk."""

    answering: str  # the message id it answers
    seen: list[str]  # the texts it was written for: the skipped ones, then the newest
    chunks: list[str] = field(default_factory=list)
    status: str = "streaming"  # then "done" or "cut short"


class FakeModel:
    """A language model stand-in: streams a canned answer to the conversation, word by word."""

    def __init__(self, chunk_delay: float = 0.05) -> None:
        self.chunk_delay = chunk_delay

    async def stream(self, history: list[str]) -> AsyncIterator[str]:
        last = history[-1]
        if len(history) > 1:
            answer = f"Sorry about that. About {last!r} (after {len(history) - 1} earlier): "
        else:
            answer = f"Hello! You said {last!r}. "
        answer += "let me look into it and get back to you with the details shortly."
        for word in answer.split(" "):
            await asyncio.sleep(self.chunk_delay)  # the model's next token takes a while
            yield word + " "


def create_app(
    state_url: str = "memory://",
    *,
    supersede_grace: float | None = 0.5,
    model: FakeModel | None = None,
    prefix: str = "supersede-bot:",
) -> FastAPI:
    """The bot's app: ``supersede_grace`` seconds after a follow-up the reply is cancelled."""
    llm = model if model is not None else FakeModel()
    chats: dict[str, list[Reply]] = {}
    holder: dict[str, EventDispatcher] = {}

    async def reply(event: Event, ctx: HandlerContext) -> None:
        history = [str(e.raw.get("text", "")) for e in (*ctx.skipped, event)]
        posted = Reply(event.message_id or "", history)
        chats.setdefault(event.thread_id, []).append(posted)
        try:
            async for chunk in llm.stream(history):
                if ctx.superseded.is_set():  # the user wrote again: stop, they moved on
                    posted.status = "cut short"
                    return
                posted.chunks.append(chunk)  # a real bot edits its message on the platform
            posted.status = "done"
        finally:
            if posted.status == "streaming":  # cancelled after the grace period
                posted.status = "cut short"

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        options = {} if state_url.startswith("memory:") else {"prefix": prefix}
        state = asynclock.state_from_url(state_url, **options)
        try:
            async with EventDispatcher(
                state,
                on_lock_conflict="supersede",
                supersede_grace=supersede_grace,
                raise_errors=False,
            ) as bot:
                bot.add_handler("message", reply)
                holder["bot"] = bot
                yield
        finally:
            holder.clear()
            await state.aclose()

    app = FastAPI(lifespan=lifespan)

    @app.post("/messages")
    async def message(request: Request) -> JSONResponse:
        body = await request.json()
        if not isinstance(body, dict) or not all(
            isinstance(body.get(name), str) and body.get(name) for name in ("chat", "id", "text")
        ):
            return JSONResponse({"error": "expected {chat, id, text} strings"}, status_code=400)
        event = Event("message", "demo", "bot", body["chat"], body["id"], {"text": body["text"]})
        delivery = await holder["bot"].deliver(event)
        status = 500 if delivery.redeliver else 200
        return JSONResponse({"outcome": delivery.outcome.value}, status_code=status)

    @app.get("/chats/{chat}")
    async def transcript(chat: str) -> JSONResponse:
        return JSONResponse(
            [
                {
                    "answering": r.answering,
                    "seen": r.seen,
                    "text": "".join(r.chunks),
                    "status": r.status,
                }
                for r in chats.get(chat, [])
            ]
        )

    return app


app = create_app(os.environ.get("ASYNCLOCK_STATE_URL", "memory://"))
