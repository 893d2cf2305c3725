"""What the dashboard's tests share: events in an inbox, dead letters made by a real ``serve()``,
an HTTP client of the app, the dashboard served by uvicorn on a loopback port, and the browser.

Keys are the dispatcher's lock keys of ``Event("message", "slack", "C1", <thread>, ...)``:
``slack:C1:<thread>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import TYPE_CHECKING

import httpx
import uvicorn

from asynclock import Event, EventDispatcher, HandlerContext
from tests._helpers import eventually
from tests.support.ports import bound_socket, port_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from typing_extensions import Self

    from asynclock.state import State
    from asynclock.web import Dashboard

#: where the tests' requests say they go (an ASGI transport has no real address)
BASE = "http://127.0.0.1:8765"
#: the flags of Debian's headless Chromium: no sandbox (root in CI), no GPU, and nothing that
#: would reach the network on its own (updates, sync, first-run pages)
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
)


def key_of(thread: str) -> str:
    """The inbox key of the tests' events of ``thread``."""
    return f"slack:C1:{thread}"


def event(thread: str, message: str, raw: dict[str, object] | None = None) -> Event:
    return Event("message", "slack", "C1", thread, message, raw if raw is not None else {})


async def accept(state: State, thread: str, count: int, *, first: int = 0) -> None:
    """Accept ``count`` events of ``thread`` with no worker running (they stay pending)."""
    bot = EventDispatcher(state, on_lock_conflict="queue")
    for n in range(first, first + count):
        await bot.accept(event(thread, f"{thread}-m{n}"))


class Worker:
    """A real ``serve()`` whose handler fails while :attr:`failing` is set (with ``"boom
    <message id>"``), and records the message ids it handled."""

    def __init__(self, state: State, *, max_attempts: int = 1) -> None:
        self.failing = True
        self.handled: list[str] = []
        self.bot = EventDispatcher(state, on_lock_conflict="queue", max_attempts=max_attempts)
        self._task: asyncio.Task[None] | None = None

        @self.bot.on("*")
        async def handle(event: Event, ctx: HandlerContext) -> None:
            if self.failing:
                raise ValueError(f"boom {event.message_id}")
            self.handled.append(str(event.message_id))

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.bot.serve())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.bot.aclose()
        if self._task is not None:
            await self._task


async def dead_letter(
    state: State, thread: str, message: str, *, raw: dict[str, object] | None = None
) -> None:
    """Make one dead letter of ``thread``: accept an event, let a failing ``serve()`` give up."""
    bot = EventDispatcher(state, on_lock_conflict="queue")
    await bot.accept(event(thread, message, raw))
    async with Worker(state):
        await eventually(lambda: _has_dead(state, key_of(thread)), within=15.0)


async def _has_dead(state: State, key: str) -> bool:
    keys = await state.inbox_keys()  # type: ignore[attr-defined]
    return any(found.key == key and found.dead > 0 for found in keys)


def client(app: Dashboard) -> httpx.AsyncClient:
    """An HTTP client of ``app`` (no network), its requests addressed to :data:`BASE`."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)


def csrf_of(page: str) -> str:
    """The CSRF token in a page."""
    found = re.search(r'data-csrf="([^"]+)"', page)
    assert found is not None, "no CSRF token in the page"
    return found.group(1)


def headers(token: str, origin: str | None = BASE) -> dict[str, str]:
    """The headers of an action sent by the page itself."""
    sent = {"x-csrf-token": token, "content-type": "application/json"}
    if origin is not None:
        sent["origin"] = origin
    return sent


def row(html: str, key: str) -> str:
    """The keys table's row of ``key`` (fails when there is none)."""
    found = re.search(rf'<tr data-key="{re.escape(key)}">(.*?)</tr>', html)
    assert found is not None, f"no row for {key!r}"
    return found.group(1)


def card(html: str, label: str) -> str:
    """The value of a header card."""
    found = re.search(
        rf'<span class="card-label">{re.escape(label)}</span><span class="card-value">([^<]*)<',
        html,
    )
    assert found is not None, f"no card {label!r}"
    return found.group(1)


@contextlib.asynccontextmanager
async def served(app: Callable[..., object]) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port, in this event loop; its base URL."""
    sock = bound_socket()
    port = port_of(sock)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await eventually(_started(server, task), within=10.0)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def _started(server: uvicorn.Server, task: asyncio.Task[None]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        if task.done():
            task.result()  # raises what stopped it
        return server.started

    return check
