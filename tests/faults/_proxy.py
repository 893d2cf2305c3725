"""A small TCP proxy on loopback that can add latency to, or blackhole, a client's traffic.

It runs in the test's own event loop::

    async with FaultProxy(upstream_port) as proxy:      # listens on 127.0.0.1:<free port>
        state = RedisState.from_url(proxy.url)
        proxy.latency = 0.05      # every chunk, both ways, is delivered 50 ms later (in order)
        proxy.blackhole = True    # bytes are read and dropped: connections stay open, silent
        proxy.blackhole = False   # traffic flows again (what was dropped stays lost)
        proxy.cut()               # close every proxied connection at once

Only what a test switches on happens: with ``latency == 0`` and no blackhole it is a plain
relay. A blackhole drops (never buffers) what it reads, so a request sent into it is never
executed, and its reply never arrives: the client can only give up on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self

_CHUNK = 65536


class FaultProxy:
    """Relay ``127.0.0.1:port`` to ``127.0.0.1:upstream_port`` with injectable faults."""

    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.latency = 0.0
        self.blackhole = False
        self.port = 0
        #: bytes dropped by the blackhole so far (both directions)
        self.dropped = 0
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        tasks = tuple(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def cut(self) -> None:
        """Close every proxied connection (both sides) now."""
        for writer in tuple(self._writers):
            writer.close()
        self._writers.clear()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers.update((client_w, server_w))
        pumps = [
            asyncio.ensure_future(self._pump(client_r, server_w)),
            asyncio.ensure_future(self._pump(server_r, client_w)),
        ]
        self._tasks.update(pumps)
        try:
            # when one direction ends (EOF, reset, cut), the whole connection goes
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._tasks.difference_update(pumps)
            for writer in (client_w, server_w):
                writer.close()
                self._writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, delaying each chunk by ``latency`` while keeping their order."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # the injected latency itself
                writer.write(data)
                await writer.drain()

        delivery = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(_CHUNK):
                if self.blackhole:
                    self.dropped += len(data)
                    continue
                queue.put_nowait((loop.time() + self.latency, data))
                if delivery.done():
                    break
            queue.put_nowait(None)
            await delivery
        except (ConnectionError, OSError):
            pass
        finally:
            delivery.cancel()
            with contextlib.suppress(BaseException):
                await delivery
