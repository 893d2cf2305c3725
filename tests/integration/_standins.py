"""Loopback stand-ins for the Slack Web API and the Telegram Bot API, recording what bots post.

Each serves on a free 127.0.0.1 port inside the test's event loop, answers the few methods the
bots call with what the real API would, and records every reply (``chat.postMessage``,
``sendMessage``) in arrival order, whichever process sent it. Nothing here leaves the machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"  # a test value, signs nothing real
BOT_TOKEN = "xoxb-test-token"
TELEGRAM_TOKEN = "42:TEST-telegram-token"


def slack_headers(
    body: bytes, secret: str = SIGNING_SECRET, retry: int | None = None
) -> dict[str, str]:
    """The headers Slack sends with ``body``: ``v0:{timestamp}:{body}`` HMAC-SHA256, hex."""
    timestamp = str(int(time.time()))
    base = b"v0:" + timestamp.encode() + b":" + body
    signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": signature,
    }
    if retry is not None:
        headers["X-Slack-Retry-Num"] = str(retry)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    return headers


@dataclass(frozen=True)
class Reply:
    """One message a bot posted: where, what, and the fencing token it carried (if any)."""

    conversation: str
    text: str
    token: int | None


@dataclass
class Recorder:
    """The replies received so far, and a way to wait for more without sleeping."""

    replies: list[Reply] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, reply: Reply) -> None:
        self.replies.append(reply)
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, condition: Callable[[], bool], seconds: float = 30.0) -> None:
        """Wait until ``condition()`` holds, re-checked after each reply; fail after ``seconds``."""

        async def waiting() -> None:
            while not condition():
                await self._changed.wait()

        try:
            await asyncio.wait_for(waiting(), seconds)
        except asyncio.TimeoutError:
            raise AssertionError(f"timed out after {seconds}s; replies: {self.replies}") from None

    def texts(self, conversation: str) -> list[str]:
        return [r.text for r in self.replies if r.conversation == conversation]


@dataclass
class StandIn:
    """A served stand-in: its base URL and what it recorded."""

    url: str
    recorder: Recorder


@asynccontextmanager
async def serve_app(app: web.Application, path: str = "") -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1:<free port>; yield its base URL (+ ``path``)."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}{path}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def slack_api() -> AsyncIterator[StandIn]:
    """The Slack Web API: ``auth.test`` (Bolt's authorization) and ``chat.postMessage``."""
    recorder = Recorder()
    stamps = itertools.count(1)

    async def method(request: web.Request) -> web.Response:
        name = request.match_info["method"]
        if request.headers.get("Authorization") != f"Bearer {BOT_TOKEN}":
            return web.json_response({"ok": False, "error": "invalid_auth"})
        if name == "auth.test":
            return web.json_response(
                {"ok": True, "team_id": "T0", "user_id": "UBOT", "bot_id": "BBOT", "user": "bot"}
            )
        if name == "chat.postMessage":
            body = await request.json()
            payload = (body.get("metadata") or {}).get("event_payload") or {}
            conversation = f"{body['channel']}:{body.get('thread_ts')}"
            recorder.add(Reply(conversation, str(body["text"]), payload.get("token")))
            return web.json_response({"ok": True, "ts": f"9.{next(stamps)}"})
        return web.json_response({"ok": False, "error": "unknown_method"})

    app = web.Application()
    app.router.add_post("/api/{method}", method)
    async with serve_app(app, "/api/") as url:
        yield StandIn(url, recorder)


@asynccontextmanager
async def telegram_api() -> AsyncIterator[StandIn]:
    """The Telegram Bot API at ``/bot<token>/<method>``: ``getMe`` and ``sendMessage``."""
    recorder = Recorder()
    ids = itertools.count(1)

    async def method(request: web.Request) -> web.Response:
        if request.match_info["token"] != TELEGRAM_TOKEN:
            return web.json_response(
                {"ok": False, "error_code": 401, "description": "Unauthorized"}
            )
        name = request.match_info["method"]
        form = {k: v if isinstance(v, str) else repr(v) for k, v in (await request.post()).items()}
        if name == "getMe":
            return web.json_response(
                {"ok": True, "result": {"id": 42, "is_bot": True, "first_name": "test"}}
            )
        if name == "sendMessage":
            chat_id = form["chat_id"]
            thread = form.get("message_thread_id")
            conversation = f"{chat_id}:{thread}" if thread else chat_id
            recorder.add(Reply(conversation, form["text"], None))
            message = {
                "message_id": next(ids),
                "date": int(time.time()),
                "chat": {"id": int(chat_id), "type": "private"},
                "text": form["text"],
            }
            return web.json_response({"ok": True, "result": message})
        return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"})

    app = web.Application()
    app.router.add_post("/bot{token}/{method}", method)
    async with serve_app(app, "") as url:
        yield StandIn(url, recorder)
