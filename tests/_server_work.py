"""Counting the server work of chosen clients on a shared server, exactly, for the scaling tests.

The test servers are shared (other test processes and other people's runs use them at the same
time), so a server-wide counter (``INFO``, ``pg_stat_database``, ``Questions``) cannot tell this
test's requests from theirs. Two exact ways instead, both recording *when* each request was seen
and *whose* it was, so a test can cut the record into windows and attribute it:

* Redis and Redis Cluster: :class:`RedisMonitor` reads ``MONITOR`` on every master and keeps the
  lines of the connections whose client name starts with a given prefix (the workers' and the
  producer's state URLs carry ``?client_name=``; names are read from ``CLIENT LIST``). A command
  run inside a script (``[0 lua]``) is not a request and is skipped: what is counted is what the
  clients sent.
* PostgreSQL (direct or through PgBouncer) and MySQL/MariaDB: :class:`CountingProxy`, a loopback
  TCP proxy per client process in front of the server, counting the client's messages as they
  pass. PostgreSQL: each Execute or simple Query message, i.e. each statement run (the states
  run every statement in a transaction of its own, so this is the transactions they run;
  asyncpg's Parse cycles that prepare a statement are not counted). MySQL: each ``COM_QUERY`` /
  ``COM_STMT_EXECUTE`` packet that opens a command (sequence id 0), the client statements the
  server's ``Questions`` counter counts.

Clients not routed through a counter (the test's own checks) are never counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from tests._workers import redis_client

if TYPE_CHECKING:
    from collections.abc import Iterable

    from typing_extensions import Self


@dataclass(frozen=True)
class Request:
    """One counted request: when it was seen (``time.time()``), whose it was, what it was."""

    at: float
    who: str
    what: str


@dataclass
class Record:
    """Every request counted so far, in the order seen."""

    requests: list[Request] = field(default_factory=list)

    def between(self, start: float, end: float) -> list[Request]:
        """The requests seen at ``start <= at < end``."""
        return [r for r in self.requests if start <= r.at < end]


# -- Redis: MONITOR --------------------------------------------------------------------------

_MONITOR_LINE = re.compile(rb'^\+(\d+\.\d+) \[(\d+) ([^\]]+)\] "([^"]*)"')


class RedisMonitor:
    """``MONITOR`` on every master of a Redis (or Redis Cluster) URL.

    Keeps the commands sent by connections named ``<prefix>...``; ``who`` is the rest of the
    name. Use :meth:`sync` before reading a window that just ended: it returns once every
    master's stream has been read past that moment.
    """

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.record = Record()
        #: (master's index, "host:port" of a connection) -> its name: a client's local address
        #: names one connection per master only (the kernel reuses a local port for another
        #: destination), so one master's CLIENT LIST must not name another master's lines
        self._names: dict[tuple[int, str], str] = {}
        self._readers: list[asyncio.Task[None]] = []
        self._streams: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._masters: list[tuple[str, int]] = []
        self._marks: dict[bytes, asyncio.Event] = {}
        self._pending: list[tuple[float, int, str, str]] = []
        #: lines of connections gone before they could be named (a test may assert none)
        self.unknown = 0

    async def __aenter__(self) -> Self:
        client = redis_client(self.url)
        try:
            if hasattr(client, "get_primaries"):
                await client.initialize()
                self._masters = [(n.host, int(n.port)) for n in client.get_primaries()]
            else:
                kwargs = client.connection_pool.connection_kwargs
                self._masters = [(kwargs.get("host", "127.0.0.1"), int(kwargs.get("port", 6379)))]
        finally:
            await client.aclose()
        for index, (host, port) in enumerate(self._masters):
            # a line per command of every client of the server: another test's large value or
            # script makes a line longer than the reader's default limit (64 KiB), which would
            # end the reading task and leave every sync waiting for its mark
            reader, writer = await asyncio.open_connection(host, port, limit=MONITOR_LINE_LIMIT)
            writer.write(b"MONITOR\r\n")
            await writer.drain()
            assert await reader.readline() == b"+OK\r\n"
            self._streams.append((reader, writer))
            self._readers.append(asyncio.create_task(self._read(index, reader)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._readers:
            task.cancel()
        await asyncio.gather(*self._readers, return_exceptions=True)
        for _, writer in self._streams:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _read(self, master: int, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            match = _MONITOR_LINE.match(line)
            if match is None:
                continue
            stamp, _, source, command = match.groups()
            if source == b"lua":
                continue  # run inside a script: not a request of a client
            if command == b"ECHO":
                for mark, seen in self._marks.items():
                    if mark in line:
                        seen.set()
                continue
            self._pending.append((float(stamp), master, source.decode(), command.decode().upper()))

    def _attribute(self) -> None:
        """Move the pending lines whose connection is ours into the record (the others go)."""
        for stamp, master, addr, command in self._pending:
            name = self._names.get((master, addr))
            if name is None:
                self.unknown += 1  # closed before CLIENT LIST saw it: whose is not known
            elif name.startswith(self.prefix):
                self.record.requests.append(Request(stamp, name[len(self.prefix) :], command))
        self._pending.clear()

    async def names(self) -> None:
        """Read every master's ``CLIENT LIST``: which connection is whose."""
        for master, (host, port) in enumerate(self._masters):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"CLIENT LIST\r\n")
                await writer.drain()
                head = await reader.readline()  # $<length>
                body = await reader.readexactly(int(head[1:]) + 2)
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
            for entry in body.decode().splitlines():
                fields = dict(part.split("=", 1) for part in entry.split(" ") if "=" in part)
                self._names[master, fields.get("addr", "")] = fields.get("name", "")
        self._attribute()

    async def sync(self, within: float = 120.0) -> None:
        """Return once every master's MONITOR stream was read past this moment (an ``ECHO`` of a
        fresh mark, sent after it, came back through every stream), then name the lines.

        ``within`` is long: the stream carries every client's commands (a whole test suite's on
        a shared server), and this process parses each line; on a loaded machine it can fall
        tens of seconds behind."""
        mark = uuid.uuid4().hex.encode()
        seen = [asyncio.Event() for _ in self._masters]
        for index, (host, port) in enumerate(self._masters):
            self._marks[mark + b"-%d" % index] = seen[index]
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"ECHO %s-%d\r\n" % (mark, index))
                await writer.drain()
                await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
        try:
            for task in self._readers:  # a reader that ended would never see the mark
                if task.done():
                    task.result()
                    raise AssertionError("a MONITOR stream ended")
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in seen)), within)
        finally:
            for index in range(len(self._masters)):
                self._marks.pop(mark + b"-%d" % index, None)
        await self.names()


#: the longest MONITOR line read whole (a command with a value of up to about this size)
MONITOR_LINE_LIMIT = 64 * 2**20


def with_client_name(url: str, name: str) -> str:
    """``url`` with ``client_name=name`` added to its query (redis-py names its connections)."""
    parts = urlsplit(url)
    query = [*parse_qsl(parts.query), ("client_name", name)]
    return urlunsplit(parts._replace(query=urlencode(query)))


# -- PostgreSQL and MySQL: a counting proxy ------------------------------------------------------

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_COM_QUERY, _COM_STMT_EXECUTE = 0x03, 0x17


class CountingProxy:
    """A loopback TCP proxy to ``target`` that counts one client's requests into ``record``.

    ``protocol`` is ``"postgres"`` (Execute and simple Query messages; an SSL or GSS encryption
    request is answered "no" by the proxy itself, so the stream stays readable) or ``"mysql"``
    (command packets ``COM_QUERY`` / ``COM_STMT_EXECUTE``).
    """

    def __init__(self, target: tuple[str, int], protocol: str, who: str, record: Record) -> None:
        if protocol not in ("postgres", "mysql"):
            raise ValueError(f"unknown protocol {protocol!r}")
        self.target = target
        self.protocol = protocol
        self.who = who
        self.record = record
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pumps: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in tuple(self._pumps):
            task.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _count(self, what: str) -> None:
        self.record.requests.append(Request(time.time(), self.who, what))

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.append(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        self._writers.append(server_w)
        upstream = self._postgres if self.protocol == "postgres" else self._mysql
        tasks = [
            asyncio.ensure_future(upstream(client_r, server_w, client_w)),
            asyncio.ensure_future(_pipe(server_r, client_w)),
        ]
        self._pumps.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._pumps.difference_update(tasks)
            for writer in (client_w, server_w):
                writer.close()

    async def _postgres(
        self,
        reader: asyncio.StreamReader,
        server: asyncio.StreamWriter,
        client: asyncio.StreamWriter,
    ) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # the untyped start-up messages
                head = await reader.readexactly(8)
                length, code = struct.unpack("!ii", head)
                body = await reader.readexactly(length - 8)
                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                    client.write(b"N")  # no encryption: the client goes on in the clear
                    await client.drain()
                    continue
                server.write(head + body)
                await server.drain()
                break
            while True:
                head = await reader.readexactly(5)
                kind, length = head[:1], struct.unpack("!i", head[1:])[0]
                body = await reader.readexactly(length - 4)
                if kind in (b"E", b"Q"):
                    self._count("execute" if kind == b"E" else "query")
                server.write(head + body)
                await server.drain()

    async def _mysql(
        self, reader: asyncio.StreamReader, server: asyncio.StreamWriter, _: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readexactly(4)
                length = int.from_bytes(head[:3], "little")
                body = await reader.readexactly(length)
                if head[3] == 0 and body[:1] and body[0] in (_COM_QUERY, _COM_STMT_EXECUTE):
                    self._count("statement")
                server.write(head + body)
                await server.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


async def proxied_url(url: str, who: str, record: Record, proxies: list[CountingProxy]) -> str:
    """``url`` (and its ``listen_url``, if any) routed through new counting proxies.

    The proxies are appended to ``proxies`` (the caller closes them).
    """
    protocol = "mysql" if url.startswith("mysql") else "postgres"

    async def reroute(one: str) -> str:
        parts = urlsplit(one)
        proxy = CountingProxy(
            (parts.hostname or "127.0.0.1", parts.port or 0), protocol, who, record
        )
        proxies.append(proxy)
        port = await proxy.start()
        auth = parts.netloc.rpartition("@")[0]
        netloc = f"{auth}@127.0.0.1:{port}" if auth else f"127.0.0.1:{port}"
        query = [
            (name, await reroute(value) if name == "listen_url" else value)
            for name, value in parse_qsl(parts.query)
        ]
        return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))

    return await reroute(url)


def whose(requests: Iterable[Request], *, by_kind: bool = False) -> dict[str, int]:
    """How many of ``requests`` each client sent (``by_kind``: of each kind)."""
    counts: dict[str, int] = {}
    for request in requests:
        name = request.what if by_kind else request.who
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
