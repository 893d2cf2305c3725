"""The server-work counters and clean-ups of the ``inbox-scale`` scenario (#24).

* Redis (plain and Cluster): :class:`MonitorFiles`, ``redis-cli MONITOR`` on every master into a
  file each; a cell counts the lines naming its keys within its window, except those run inside
  a script (``[0 lua]``): the requests the clients sent.
* MariaDB: :func:`count_mysql_statements` records the time of every ``COM_QUERY`` aiomysql sends
  in the process (workers and producer alike): the client statements the server's ``Questions``
  counts, but only this run's, on a server that others use too.
* PostgreSQL: :func:`committed`, ``xact_commit`` of :data:`BENCH_DB`, a database of the
  scenario's own, read once none of its sessions is left (a backend's counts reach the
  statistics at the latest when it exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio

#: the PostgreSQL database of this scenario alone, so that its committed transactions are ours
BENCH_DB = "asynclock_inbox_scale"


def database_url(url: str, database: str) -> str:
    """``url`` with another database name."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


# -- MySQL statements, counted at the driver --------------------------------------------------

STAMPS: list[float] = []


def count_mysql_statements() -> None:
    """From now on, record the time of every ``COM_QUERY`` aiomysql sends in this process."""
    from aiomysql import connection  # type: ignore[import-untyped]
    from pymysql.constants import COMMAND  # type: ignore[import-untyped]

    original = connection.Connection._execute_command
    if getattr(original, "counted", False):
        return

    async def execute(self: Any, command: int, sql: Any) -> Any:
        if command == COMMAND.COM_QUERY:
            STAMPS.append(time.perf_counter())
        return await original(self, command, sql)

    execute.counted = True  # type: ignore[attr-defined]
    connection.Connection._execute_command = execute


# -- Redis: MONITOR through redis-cli ------------------------------------------------------------

_LINE = re.compile(r"^(\d+\.\d+) \[\d+ ([^\]]+)\] (.*)$")


class MonitorFiles:
    """``redis-cli MONITOR`` on every master, each into a file of its own.

    :meth:`count` reads the lines of a time window that name ``namespace`` (every key and
    channel of a cell does) and were sent by a client, not run inside a script (``[0 lua]``).
    """

    def __init__(self, masters: list[tuple[str, int]]) -> None:
        self.masters = masters
        self.folder = Path()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []

    def start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="inbox-scale-monitor-"))
        for n, (host, port) in enumerate(self.masters):
            path = self.folder / f"monitor-{n}.log"
            with path.open("wb") as output:  # the child keeps its own descriptor
                self.procs.append(
                    subprocess.Popen(
                        ["redis-cli", "-h", host, "-p", str(port), "monitor"],
                        stdout=output,
                        stderr=subprocess.DEVNULL,
                    )
                )
            self.files.append(path)

    async def sync(self, within: float = 30.0) -> None:
        """Return once every file holds all lines up to now (an ``ECHO`` mark sent after now
        has arrived in each)."""
        mark = f"inbox-scale-sync-{uuid.uuid4().hex}".encode()
        offsets = [path.stat().st_size for path in self.files]
        for host, port in self.masters:
            client = redis.asyncio.Redis(host=host, port=port)
            try:
                await client.echo(mark)
            finally:
                await client.aclose()
        deadline = time.monotonic() + within
        for path, offset in zip(self.files, offsets, strict=True):
            while True:
                with path.open("rb") as data:
                    data.seek(max(offset - len(mark), 0))
                    if mark in data.read():
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"MONITOR output {path} did not catch up within {within} s")
                await asyncio.sleep(0.05)

    def count(self, namespace: str, start: float, end: float) -> int:
        """Requests naming ``namespace`` sent at ``start <= time < end`` (``time.time()``)."""
        total = 0
        needle = namespace
        for path in self.files:
            with path.open("r", encoding="utf-8", errors="replace") as lines:
                for line in lines:
                    if needle not in line:
                        continue
                    match = _LINE.match(line)
                    if match is None or match.group(2) == "lua":
                        continue
                    if start <= float(match.group(1)) < end:
                        total += 1
        return total

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()  # our own redis-cli, by its handle
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for path in self.files:
            path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.folder.rmdir()
        self.procs, self.files = [], []


async def masters_of(url: str) -> list[tuple[str, int]]:
    """The masters behind a ``redis://`` or ``redis+cluster://`` URL."""
    parts = urlsplit(url)
    if parts.scheme != "redis+cluster":
        return [(parts.hostname or "127.0.0.1", parts.port or 6379)]
    first = parts.netloc.rpartition("@")[2].split(",")[0]
    cluster = redis.asyncio.RedisCluster.from_url(f"redis://{first}")
    try:
        await cluster.initialize()
        return [(node.host, int(node.port)) for node in cluster.get_primaries()]
    finally:
        await cluster.aclose()


# -- PostgreSQL: committed transactions of the scenario's database -------------------------------


async def ensure_database(admin_url: str) -> None:
    """Create :data:`BENCH_DB` on the server of ``admin_url`` unless it exists."""
    import asyncpg  # type: ignore[import-untyped]

    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", BENCH_DB):
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                await conn.execute(f'CREATE DATABASE "{BENCH_DB}"')
    finally:
        await conn.close()


async def committed(admin_url: str, within: float = 30.0) -> int:
    """``xact_commit`` of :data:`BENCH_DB`, once no session of it is left (a backend's counts
    reach the statistics at the latest when it exits), read from another database."""
    import asyncpg

    conn = await asyncpg.connect(admin_url, timeout=10)
    try:
        deadline = time.monotonic() + within
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = $1"
        while await conn.fetchval(query, BENCH_DB):
            if time.monotonic() > deadline:
                raise RuntimeError(f"sessions of {BENCH_DB} still open after {within} s")
            await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        value = await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", BENCH_DB
        )
        return int(value)
    finally:
        await conn.close()


async def prepare_procrastinate(url: str) -> None:
    """Apply procrastinate's schema to the scenario's database once."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))
    async with app.open_async():
        if not await _has_table(url, "procrastinate_jobs"):
            await app.schema_manager.apply_schema_async()


async def delete_jobs(url: str, queue: str) -> None:
    """Delete a cell's procrastinate jobs (and, by cascade, their events)."""
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        await conn.execute("DELETE FROM procrastinate_jobs WHERE queue_name = $1", queue)
    finally:
        await conn.close()


async def delete_rows(url: str, pattern: str) -> None:
    """Delete the asynclock rows whose key matches ``pattern`` (a ``LIKE``) in ``url``'s
    database: what a cell's locks, claims and inboxes left."""
    tables = ("asynclock_locks", "asynclock_dedupe", "asynclock_inboxes")
    entries = (
        "DELETE FROM asynclock_inbox_entries WHERE inbox IN "
        "(SELECT id FROM asynclock_inboxes WHERE name LIKE {})"
    )
    statements = [entries, *(f"DELETE FROM {t} WHERE name LIKE {{}}" for t in tables)]
    if url.startswith("mysql"):
        from benchmarks.harness.sql_server import mysql_connect

        my = await mysql_connect(url)
        try:
            cursor = await my.cursor()
            for statement in statements:
                await cursor.execute(statement.format("%s"), (pattern,))
            await cursor.close()
        finally:
            my.close()
        return
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        for statement in statements:
            await conn.execute(statement.format("$1"), pattern)
        # with autovacuum off (as on this machine) the deleted rows stay in the tables, and every
        # later cell's claims scan them: the runs of one afternoon slowed to half
        await conn.execute(f"VACUUM {', '.join(('asynclock_inbox_entries', *tables))}")
    finally:
        await conn.close()


async def _has_table(url: str, table: str) -> bool:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        return bool(await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table))
    finally:
        await conn.close()
