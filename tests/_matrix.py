"""The backend matrix as data: every conformance test runs once per entry of ``STATES``.

Adding a backend is one ``_server(...)`` line below (plus, if its keys need cleaning, one case in
:func:`purge_namespace`). Server URLs can be overridden with environment variables so the suite
can run against servers elsewhere; by default it uses the loopback servers of ``.ci/services.sh``.

A server that does not answer is a *skip with a reason* locally and a *test error* in CI
(``CI=true``): CI must never go green by skipping a backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}

#: Every key a test writes on a shared server starts with this, then the test's namespace.
TEST_PREFIX = "asynclock-test:"


@dataclass(frozen=True)
class Backend:
    """One row of the matrix.

    Attributes:
        name: the test id (``test_x[redis]``) and the marker name.
        url: what ``state_from_url`` is given.
        namespace_option: the keyword of ``state_from_url`` that isolates one test's keys from
            every other test on the same server (``None``: each state is private anyway).
    """

    name: str
    url: str
    namespace_option: str | None = None
    #: the pytest marker of its tests (default: ``name``)
    marker: str | None = None
    #: False: the tests marked ``slow`` are not collected for this row (a second way to a server
    #: whose direct row runs them; keeps ``make test`` within its time budget)
    slow: bool = True

    @property
    def server(self) -> bool:
        """True when processes other than this one can share the state (a real server)."""
        return self.namespace_option is not None

    def options(self, namespace: str) -> dict[str, object]:
        """The ``state_from_url`` keywords that give a state the fresh ``namespace``."""
        if self.namespace_option is None:
            return {}
        return {self.namespace_option: f"{TEST_PREFIX}{namespace}:"}


def _server(
    name: str,
    env: str,
    default: str,
    namespace_option: str = "prefix",
    marker: str | None = None,
    *,
    slow: bool = True,
) -> Backend:
    return Backend(name, os.environ.get(env, default), namespace_option, marker, slow)


MEMORY = Backend("memory", "memory://")
REDIS = _server("redis", "ASYNCLOCK_REDIS_URL", "redis://127.0.0.1:6379/0")
#: three masters on 127.0.0.1:7000-7002 (.ci/services.sh); marked ``redis`` like the single server
REDIS_CLUSTER = _server(
    "redis-cluster",
    "ASYNCLOCK_REDIS_CLUSTER_URL",
    "redis+cluster://127.0.0.1:7000",
    marker="redis",
)
POSTGRES = _server(
    "postgres", "ASYNCLOCK_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
#: the same database through PgBouncer in transaction mode (127.0.0.1:6432, .ci/services.sh):
#: asyncpg's statement cache off, the listener straight to the server (docs/backends-sql.md)
POSTGRES_PGBOUNCER = _server(
    "postgres-pgbouncer",
    "ASYNCLOCK_PGBOUNCER_URL",
    "postgresql://postgres@127.0.0.1:6432/test?"
    + urlencode({"statement_cache_size": 0, "listen_url": POSTGRES.url}),
    marker="postgres",
    slow=False,
)
MYSQL = _server("mysql", "ASYNCLOCK_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")

BACKENDS: tuple[Backend, ...] = (MEMORY, REDIS, REDIS_CLUSTER, POSTGRES, POSTGRES_PGBOUNCER, MYSQL)
SERVER_BACKENDS: tuple[Backend, ...] = tuple(b for b in BACKENDS if b.server)


def _param(backend: Backend) -> object:
    marker = backend.marker or backend.name
    return pytest.param(backend, id=backend.name, marks=getattr(pytest.mark, marker))


#: ``@pytest.fixture(params=STATES)``: every backend.
STATES = [_param(b) for b in BACKENDS]
#: Backends that several OS processes can share (the cross-process tests).
SERVER_STATES = [_param(b) for b in SERVER_BACKENDS]
#: Backends with the durable inbox (``InboxState``): every built-in one (``test_inbox.py`` checks
#: that a state without it is refused with a clear error).
INBOX_BACKENDS: tuple[Backend, ...] = (
    MEMORY,
    REDIS,
    REDIS_CLUSTER,
    POSTGRES,
    POSTGRES_PGBOUNCER,
    MYSQL,
)
INBOX_STATES = [_param(b) for b in INBOX_BACKENDS]
#: the inbox backends that several OS processes can share (``test_inbox_processes.py``)
INBOX_SERVER_STATES = [_param(b) for b in INBOX_BACKENDS if b.server]
#: the SQL states' inbox (``test_inbox_sql.py``)
SQL_INBOX_STATES = [_param(b) for b in INBOX_BACKENDS if b in (POSTGRES, POSTGRES_PGBOUNCER, MYSQL)]


_DEFAULT_PORTS = {
    "redis": 6379,
    "rediss": 6379,
    "redis+cluster": 6379,
    "postgresql": 5432,
    "postgres": 5432,
    "mysql": 3306,
}


@cache
def not_ready_reason(backend: Backend) -> str | None:
    """``None`` when the backend's server accepts connections, else why not (probed once).

    The probe opens a plain socket to the URL's address: it does not use asynclock, so a bug in
    the library shows up as a failing test, never as a skipped one.
    """
    if not backend.server:
        return None
    parts = urlsplit(backend.url)
    try:
        if parts.scheme == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2.0)
                sock.connect(parts.path)
        else:
            host = parts.hostname or "127.0.0.1"
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
            if port is None:
                return f"{backend.name}: no port in {backend.url!r}"
            socket.create_connection((host, port), timeout=2.0).close()
    except OSError as exc:
        where = parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port}"
        return f"{backend.name} server at {where} is not reachable: {exc}"
    return None


_SERVICES = Path(__file__).resolve().parents[1] / ".ci" / "services.sh"
_started_services = False


def _start_local_services() -> None:
    """Run ``.ci/services.sh`` once per test session: it starts whichever loopback server
    (Redis, the 3-master Redis Cluster, PostgreSQL, PgBouncer, MariaDB) is not answering."""
    global _started_services
    if _started_services or not _SERVICES.is_file():
        return
    _started_services = True
    subprocess.run(["bash", str(_SERVICES)], capture_output=True, timeout=180, check=False)
    not_ready_reason.cache_clear()


def require(backend: Backend) -> None:
    """Skip (locally) or fail (in CI) the current test when the backend's server is down.

    A loopback server that is down is started first (``.ci/services.sh``), once per session.
    """
    reason = not_ready_reason(backend)
    if reason is not None and urlsplit(backend.url).hostname in ("127.0.0.1", "localhost"):
        _start_local_services()
        reason = not_ready_reason(backend)
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


async def purge_namespace(backend: Backend, namespace: str) -> None:
    """Delete every key of ``namespace`` from the backend's server (never anything else)."""
    if backend.name == "redis":
        from redis.asyncio import Redis

        client = Redis.from_url(backend.url)
        try:
            keys = [key async for key in client.scan_iter(match=f"*{namespace}*", count=1000)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()
    elif backend.name == "redis-cluster":
        await _purge_cluster(backend, namespace)
    elif backend.name in ("postgres", "postgres-pgbouncer", "mysql"):
        await _purge_sql(backend, f"{TEST_PREFIX}{namespace}:")


async def _purge_cluster(backend: Backend, namespace: str) -> None:
    """Delete the namespace's keys from every master (SCAN is per node on a cluster)."""
    from redis.asyncio import Redis, RedisCluster

    parts = urlsplit(backend.url)
    # the first node of redis+cluster://[user:password@]host:port[,host:port...]
    first = parts.netloc.rpartition("@")[2].split(",")[0]
    auth = parts.netloc.rpartition("@")[0]
    cluster = RedisCluster.from_url(f"redis://{auth + '@' if auth else ''}{first}")
    try:
        await cluster.initialize()
        for node in cluster.get_primaries():
            client = Redis(
                host=node.host,
                port=int(node.port),
                username=unquote(parts.username) if parts.username else None,
                password=unquote(parts.password) if parts.password else None,
            )
            try:
                async for key in client.scan_iter(match=f"*{namespace}*", count=1000):
                    await client.delete(key)  # one key per DEL: keys live in different slots
            finally:
                await client.aclose()
    finally:
        await cluster.aclose()


#: the tables of the SQL states under their default ``table_prefix``, with a ``name`` column
SQL_TABLES = (
    "asynclock_locks",
    "asynclock_dedupe",
    "asynclock_inboxes",
    "asynclock_semaphores",
)
#: a semaphore's permits and places go first, by the id of its semaphores row (they have no name)
SQL_SEMAPHORE_ROWS = tuple(
    f"DELETE FROM asynclock_{table} WHERE semaphore IN "
    "(SELECT id FROM asynclock_semaphores WHERE name LIKE {})"
    for table in ("semaphore_holders", "semaphore_waiters")
)
#: the inbox entries go first, by the id of their key's inboxes row (they have no name)
SQL_INBOX_ENTRIES = (
    "DELETE FROM asynclock_inbox_entries WHERE inbox IN "
    "(SELECT id FROM asynclock_inboxes WHERE name LIKE {})"
)


async def _purge_sql(backend: Backend, key_prefix: str) -> None:
    """Delete the rows whose key starts with ``key_prefix`` (tables not created yet: nothing)."""
    # The prefix is "asynclock-test:<hex>:": no LIKE wildcard in it.
    statements = [SQL_INBOX_ENTRIES, *SQL_SEMAPHORE_ROWS]
    statements += [f"DELETE FROM {table} WHERE name LIKE {{}}" for table in SQL_TABLES]
    await run_sql(backend, statements, f"{key_prefix}%")


async def run_sql(backend: Backend, statements: list[str], *args: object) -> list[object]:
    """Run each statement on the backend's SQL server in autocommit mode, with ``args``.

    ``{}`` in a statement stands for the one parameter placeholder (``$1`` or ``%s``); a
    statement about a table that does not exist (yet) is skipped (its answer: ``None``).
    Returns the first column of the first row each statement answered (``None`` if none).
    """
    answers: list[object] = []
    if backend.name.startswith("postgres"):
        import asyncpg  # type: ignore[import-untyped]

        from asynclock.state.postgres._pooler import pooler_options

        # the URL's asynclock options are not for asyncpg; no named statements (PgBouncer)
        dsn = pooler_options(backend.url, None, None).dsn
        conn = await asyncpg.connect(dsn, timeout=10, statement_cache_size=0)
        try:
            for statement in statements:
                answer = None
                with contextlib.suppress(asyncpg.UndefinedTableError):
                    answer = await conn.fetchval(statement.format("$1"), *args)
                answers.append(answer)
        finally:
            await conn.close()
        return answers
    import aiomysql  # type: ignore[import-untyped]

    parts = urlsplit(backend.url)
    mysql = await aiomysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        db=parts.path.lstrip("/") or None,
        autocommit=True,
        connect_timeout=10,
        # as the states' own connections: a purge's "WHERE ... IN (SELECT ... LIKE ...)" reads the
        # subquery's table without locking every row it scans (under REPEATABLE READ it would
        # hold shared locks on other tests' rows, whose statements then wait for it)
        init_command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    )
    try:
        async with mysql.cursor() as cursor:
            for statement in statements:
                if not await _execute_mysql(cursor, statement.format("%s"), args):
                    answers.append(None)  # no such table (yet)
                    continue
                row = await cursor.fetchone()
                answers.append(row[0] if row else None)
    finally:
        mysql.close()
    return answers


async def rows_of(backend: Backend, table: str, key_prefix: str) -> int:
    """How many rows of ``table`` (default table prefix) hold keys starting with ``key_prefix``."""
    [count] = await run_sql(
        backend, [f"SELECT count(*) FROM {table} WHERE name LIKE {{}}"], f"{key_prefix}%"
    )
    return int(str(count or 0))


async def expire_rows(backend: Backend, table: str, key_prefix: str) -> None:
    """Move the expiry of the rows of ``table`` whose keys start with ``key_prefix`` an hour
    into the past, by the server's clock: expired now, and expired long enough for any
    ``token_retention`` a test uses.

    A test of the purge makes its rows expire this way rather than with a TTL of a millisecond:
    such a TTL has run out before the test counted the rows, so another test's purge (purges
    take every expired row of a table) may delete them first.
    """
    if backend.name.startswith("postgres"):
        past = "now() - interval '1 hour'"
    else:
        past = "UTC_TIMESTAMP(3) - INTERVAL 1 HOUR"
    await run_sql(
        backend, [f"UPDATE {table} SET expires_at = {past} WHERE name LIKE {{}}"], f"{key_prefix}%"
    )


#: attempts of one test statement that InnoDB chose as a deadlock victim (with a pause between
#: them that grows: five back-to-back attempts all lost once, under a loaded CI run)
_DEADLOCK_ATTEMPTS = 10


async def _execute_mysql(cursor: Any, statement: str, args: tuple[object, ...]) -> bool:
    """Run one autocommit statement; ``False`` if its table does not exist.

    ER_LOCK_DEADLOCK is retried: a range ``DELETE`` of a purge can meet the states' own
    transactions of tests running in other processes, and InnoDB then rolls back one of
    them; in autocommit the statement alone is lost, so running it again is what the server
    asks for.
    """
    import pymysql  # type: ignore[import-untyped]

    for attempt in range(1, _DEADLOCK_ATTEMPTS + 1):
        try:
            await cursor.execute(statement, args or None)
        except pymysql.err.OperationalError as exc:  # noqa: PERF203 - retried on purpose
            if exc.args[0] != 1213 or attempt == _DEADLOCK_ATTEMPTS:  # ER_LOCK_DEADLOCK
                raise
            # the other transactions finish meanwhile; random, so two purges do not meet again
            await asyncio.sleep(random.uniform(0.01, 0.05) * attempt)
        except pymysql.err.ProgrammingError as exc:
            if exc.args[0] != 1146:  # ER_NO_SUCH_TABLE
                raise
            return False
        else:
            return True
    raise AssertionError("unreachable")
