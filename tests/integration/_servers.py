"""Serve the example apps on a free loopback port inside the test's event loop.

The servers run in the test's own loop, so a test can hold the example handler (its journal's
``gate``) and watch it (``journal.wait_for``) without sleeping: every race is decided by events
the test waits for, never by how long something took.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import uvicorn
from aiohttp import web

from tests.support.ports import bound_socket, port_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine

    from fastapi import FastAPI

    from examples._slack import Journal

T = TypeVar("T")

#: seconds any single wait of these tests may take before it counts as a hang
BOUND = 30.0


async def bounded(awaitable: Awaitable[T], what: str, seconds: float = BOUND) -> T:
    """Await ``awaitable`` for at most ``seconds``; fail with ``what`` if it takes longer."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError:
        # chained, not "from None": a timeout while the test unwinds after a failure (a shutdown
        # waiting for a request the failed test never let finish) must not hide that failure
        raise AssertionError(f"timed out after {seconds}s waiting for {what}")  # noqa: B904


@dataclass
class Running:
    """A served app: where it answers, its journal, and how to shut it down (drains)."""

    kind: str
    base_url: str
    journal: Journal
    stop: Callable[[], Coroutine[object, object, None]]


@asynccontextmanager
async def serve_fastapi(app: FastAPI, journal: Journal) -> AsyncIterator[Running]:
    """Serve ``app`` with uvicorn (lifespan on) on 127.0.0.1:<free port>."""
    sock = bound_socket()
    port = port_of(sock)
    config = uvicorn.Config(
        app, lifespan="on", log_level="warning", ws="none", access_log=False, http="h11"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))

    async def started() -> None:
        while not server.started:  # uvicorn offers no event for this
            if task.done():
                raise AssertionError(f"uvicorn did not start: {task.result()!r}")
            await asyncio.sleep(0.01)

    stopped = False

    async def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        server.should_exit = True
        await bounded(asyncio.shield(task), "uvicorn's shutdown")

    try:
        await bounded(started(), "uvicorn's startup")
        yield Running("fastapi", f"http://127.0.0.1:{port}", journal, stop)
    finally:
        try:
            await stop()
        finally:
            sock.close()


@asynccontextmanager
async def serve_aiohttp(app: web.Application, journal: Journal) -> AsyncIterator[Running]:
    """Serve ``app`` with aiohttp's ``AppRunner`` + ``TCPSite`` on 127.0.0.1:<free port>."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await bounded(runner.setup(), "aiohttp's startup")
    stopped = False

    async def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        await bounded(runner.cleanup(), "aiohttp's cleanup")

    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield Running("aiohttp", f"http://{host}:{port}", journal, stop)
    finally:
        await stop()
