"""MySQLState: locks and dedupe records in MySQL 8 or MariaDB 10.6+ tables, through aiomysql.

Every operation is one statement of ``queries.sql`` run in autocommit mode (one transaction),
so it is atomic against every client of the database and uses the server's clock
(``UTC_TIMESTAMP(3)``, never the session-time-zone ``NOW()``). The tables come from
``schema.sql``; keys are stored as the SHA-256 of ``prefix + key`` (the primary key) next to the
key itself, so keys of any length and characters fit.

Wake-ups: MySQL has no server-side notification a client could wait on without holding a
session lock. A release wakes the waiters of the same state at once; a waiter in another state
(another process) re-checks the key after a short back-off (5 ms, doubling up to 100 ms, never
past the holder's remaining TTL): see :class:`PollingWatch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

import aiomysql  # type: ignore[import-untyped]
from pymysql import err as mysql_errors  # type: ignore[import-untyped]
from pymysql.constants import CLIENT  # type: ignore[import-untyped]

from asynclock._compat import deadline_after, deadline_at
from asynclock._owner import new_process_id
from asynclock._validate import check_key, check_seconds, check_ttl, ttl_ms
from asynclock.state._errors import unavailable_error
from asynclock.state._protocol import Grant, LockInfo, Release
from asynclock.state._sql import (
    ConnectionPool,
    check_table_prefix,
    key_id,
    load_queries,
    load_schema,
    mark_of,
    shielded,
)
from asynclock.state._url import StateURL, redact
from asynclock.state._watch import EventWatch

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
    from types import TracebackType

    from typing_extensions import Self

    from asynclock._errors import StateUnavailableError

__all__ = ["MySQLState", "PollingWatch"]

logger = logging.getLogger("asynclock")

#: driver errors that mean "cannot reach the server / the connection is gone / timed out"
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    mysql_errors.OperationalError,  # 2003 cannot connect, 2006/2013 gone, 1205 lock wait, ...
    mysql_errors.InterfaceError,  # the connection is closed
    ConnectionError,
    OSError,
)
_UNAVAILABLE_OR_TIMEOUT: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    TimeoutError,
    asyncio.TimeoutError,
)
#: server errors after which the whole statement was rolled back and may simply run again
_RETRYABLE_CODES = frozenset({1213, 1205})  # deadlock victim, lock wait timeout
#: below this, a MySQL error code comes from the server (an error packet: the stream is in
#: sync); 2000 and up are client errors (lost connection, ...)
_CLIENT_ERROR_CODES = 2000
#: every fencing token is at least this (microseconds since 1970 at any date after 2001):
#: ``acquire`` answers smaller numbers for "held, this many milliseconds left"
_TOKEN_FLOOR = 10**15
_PURGE_BATCH = 500
_RETRIES = 5

#: the back-off of a waiter in another state, which no release notification reaches
FIRST_POLL = 0.005
MAX_POLL = 0.1


class _Cursor(Protocol):
    rowcount: int
    lastrowid: int | None

    async def execute(self, query: str, args: Mapping[str, object] | None = None) -> int: ...
    async def fetchall(self) -> Sequence[Sequence[object]]: ...
    async def close(self) -> None: ...


class _Connection(Protocol):
    """The part of ``aiomysql.Connection`` this module uses."""

    def cursor(self) -> Awaitable[_Cursor]: ...
    def close(self) -> None: ...
    async def ensure_closed(self) -> None: ...


_Result = tuple[int, int, "Sequence[Sequence[object]]"]


class PollingWatch:
    """Release notifications for one key where the server cannot push them (MySQL).

    A release made through the same :class:`MySQLState` sets the event at once. Otherwise
    :meth:`wait` returns ``False`` after a back-off shorter than ``timeout`` (5 ms, doubling to
    100 ms), so the caller re-checks the key: waiting across processes is bounded polling, at
    most about ten attempts a second per waiting state and key, and never past the holder's
    remaining TTL (the caller's ``timeout``).
    """

    __slots__ = ("_delay", "_event")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._event = EventWatch(loop)
        self._delay = FIRST_POLL

    def fire(self) -> None:
        """A release was seen in this state: wake the waiter now."""
        self._event.fire()

    def reset(self) -> None:
        """Forget notifications received so far."""
        self._event.reset()

    async def wait(self, timeout: float) -> bool:
        """``True`` when a local release was announced, ``False`` after the back-off or timeout."""
        delay = min(self._delay, max(timeout, 0.0))
        if await self._event.wait(delay):
            self._delay = FIRST_POLL  # the key moves: look closely again
            return True
        self._delay = min(self._delay * 2, MAX_POLL)
        return False


class MySQLState:
    """Locks and dedupe records in MySQL 8 / MariaDB 10.6+, shared by every process using them.

    Invariants:

    * Acquire, release, extend, abandon and dedupe are each one SQL statement in its own
      transaction, so atomic against every client; expiry is decided by the server's
      ``UTC_TIMESTAMP(3)`` (millisecond precision), never by the client's clock.
    * Fencing tokens strictly increase per key: ``max(last + 1, server clock in µs)``; a lock row
      is kept after release (and purged ``token_retention`` seconds later at the earliest).
    * Every operation answers within ``op_timeout`` seconds (connection wait included) or raises
      :class:`~asynclock.StateUnavailableError`, chained to the driver's error. A statement
      chosen as a deadlock victim (rolled back whole) is run again.
    * A statement interrupted by a cancellation finishes in the background and its connection
      is reused; one that overran the deadline is discarded.
    * Waiters in other processes are not notified: they poll with a bounded back-off
      (:class:`PollingWatch`).

    One MySQLState serves one event loop (aiomysql connections belong to a loop). Build it with
    :meth:`from_url`.

    Args:
        connect: opens one new aiomysql connection (``from_url`` supplies it).
        where: how ``repr`` and error messages name the server (no password).
        prefix: put in front of every key, so applications sharing the tables never meet.
        table_prefix: put in front of the table names (a plain identifier).
        op_timeout: seconds one operation may take, connection wait included.
        max_connections: the most connections the state opens.
        create_schema: run ``schema.sql`` (idempotent) before the first operation; set it to
            ``False`` when migrations own the schema.
        token_retention: seconds a released key's row is kept before :meth:`purge_expired` may
            delete it.
        reservation: seconds a release keeps the lock reserved for a waiting state (another
            process) that flagged it, before anyone may take it.
        purge_interval: seconds between opportunistic background purges of expired rows (one
            small batch each); ``None`` turns them off.
    """

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, _Connection]],
        *,
        where: str = "MySQL",
        prefix: str = "asynclock:",
        table_prefix: str = "asynclock_",
        op_timeout: float = 5.0,
        max_connections: int = 10,
        create_schema: bool = True,
        token_retention: float = 60.0,
        reservation: float = 0.25,
        purge_interval: float | None = 60.0,
    ) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
        self._prefix = prefix
        self._table_prefix = check_table_prefix(table_prefix)
        op = check_seconds(op_timeout, "op_timeout")
        assert op is not None
        self._op_timeout = op
        self._retention_ms = ttl_ms(check_ttl(token_retention, "token_retention"))
        self._reservation_ms = ttl_ms(check_ttl(reservation, "reservation"))
        # an abandoned acquire cannot be in flight for longer than an operation may take
        self._mark_ttl_ms = ttl_ms(max(2 * op, 2.0))
        self._purge_interval = check_seconds(purge_interval, "purge_interval", allow_none=True)
        self._schema_ready = not create_schema
        self._schema_lock = asyncio.Lock()
        self._where = where
        self._process = new_process_id()
        self._queries = load_queries(__package__ or __name__, self._table_prefix)
        self._pool: ConnectionPool[_Connection] = ConnectionPool(
            connect, _discard, _close, max_connections
        )
        self._watches: dict[str, set[PollingWatch]] = {}
        #: ids (hex) of keys this state may have flagged with a failed waiting acquire
        self._flagged: set[str] = set()
        self._next_purge = 0.0
        self._purge_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "asynclock:",
        table_prefix: str = "asynclock_",
        connect_timeout: float = 5.0,
        op_timeout: float = 5.0,
        max_connections: int = 10,
        create_schema: bool = True,
        token_retention: float = 60.0,
        reservation: float = 0.25,
        purge_interval: float | None = 60.0,
    ) -> MySQLState:
        """Build a state with its own connections from ``mysql://user:password@host:port/db``.

        ``?unix_socket=/path`` connects through a socket instead of TCP. Connections use
        utf8mb4, autocommit, ``READ COMMITTED`` (fewer gap locks between concurrent upserts)
        and ``CLIENT_FOUND_ROWS`` (rowcount counts matched rows). At most ``max_connections``
        are open; a burst waits for a free one within ``op_timeout``.
        """
        parsed = StateURL(url)
        if parsed.scheme != "mysql":
            raise ValueError(f"not a MySQL URL: {redact(url)!r}")
        parts = urlsplit(url)
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise ValueError(f"the MySQL URL names no database: {redact(url)!r}")
        query = dict(parse_qsl(parts.query))
        connect = check_seconds(connect_timeout, "connect_timeout")
        lock_wait = max(1, round(check_seconds(op_timeout, "op_timeout") or 1))
        options: dict[str, object] = {
            "host": parts.hostname or "127.0.0.1",
            "port": parts.port or 3306,
            "user": unquote(parts.username or "root"),
            "password": unquote(parts.password or ""),
            "db": database,
            "charset": "utf8mb4",
            "autocommit": True,
            "client_flag": CLIENT.FOUND_ROWS,
            "connect_timeout": connect,
            "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        }
        if "unix_socket" in query:
            options["unix_socket"] = query["unix_socket"]

        async def open_connection() -> _Connection:
            conn: _Connection = await aiomysql.connect(**options)
            try:
                cursor = await conn.cursor()
                # A statement waiting for a row lock gives up within the operation timeout. No
                # notes ("table already exists" from the idempotent schema): aiomysql would fetch
                # each one with an extra SHOW WARNINGS round trip and raise it as a Warning.
                await cursor.execute(
                    f"SET SESSION innodb_lock_wait_timeout = {lock_wait}, SESSION sql_notes = 0"
                )
                await cursor.close()
            except BaseException:
                conn.close()
                raise
            return conn

        return cls(
            open_connection,
            where=f"MySQL at {redact(url)}",
            prefix=prefix,
            table_prefix=table_prefix,
            op_timeout=op_timeout,
            max_connections=max_connections,
            create_schema=create_schema,
            token_retention=token_retention,
            reservation=reservation,
            purge_interval=purge_interval,
        )

    def __repr__(self) -> str:
        return f"MySQLState({self._where.removeprefix('MySQL at ')}, prefix={self._prefix!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the background purge, wake every watcher, close the connections."""
        self._closed = True
        purge, self._purge_task = self._purge_task, None
        if purge is not None:
            purge.cancel()
            await asyncio.wait((purge,))
        for watches in tuple(self._watches.values()):
            for watch in tuple(watches):
                watch.fire()
        await self._pool.aclose()
        await asyncio.sleep(0)

    @property
    def prefix(self) -> str:
        """The prefix of every key this state writes."""
        return self._prefix

    @property
    def table_prefix(self) -> str:
        """The prefix of this state's table names."""
        return self._table_prefix

    # -- plumbing ---------------------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> StateUnavailableError:
        return unavailable_error(exc, self._where, self._op_timeout)

    async def _ensure_schema(self) -> None:
        async with self._schema_lock:
            if self._schema_ready:
                return
            for statement in load_schema(__package__ or __name__, self._table_prefix):
                await self._call(statement, None, idempotent=True)
            self._schema_ready = True

    async def _call(
        self, sql: str, params: Mapping[str, object] | None, *, idempotent: bool
    ) -> _Result:
        """Run one statement; return ``(rowcount, lastrowid, rows)``.

        A deadlock victim or lock-wait timeout (the statement was rolled back whole) runs again;
        a reused connection that turns out dead is replaced and the statement retried once if
        ``idempotent``. A cancelled caller leaves the statement to finish in the background.
        """
        pool = self._pool
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._op_timeout
        try:
            async with deadline_at(deadline):
                stale_retry = idempotent
                rolled_back = 0
                while True:
                    conn, reused = await pool.checkout()

                    def settle(task: asyncio.Task[_Result], conn: _Connection = conn) -> None:
                        exc = None if task.cancelled() else task.exception()
                        broken = task.cancelled() or (
                            exc is not None and not _is_statement_error(exc)
                        )
                        pool.checkin(conn, broken=broken)

                    try:
                        result = await shielded(
                            _execute(conn, sql, params),
                            settle=settle,
                            kill=conn.close,
                            deadline=deadline,
                            grace=self._op_timeout,
                        )
                    except asyncio.CancelledError:
                        raise  # settled by shielded()
                    except BaseException as exc:
                        if _is_statement_error(exc):
                            pool.checkin(conn, broken=False)  # an error packet: in sync
                            if _code(exc) in _RETRYABLE_CODES and rolled_back < _RETRIES:
                                rolled_back += 1
                                continue
                            raise
                        pool.checkin(conn, broken=True)
                        if stale_retry and reused and isinstance(exc, _UNAVAILABLE):
                            stale_retry = False
                            continue
                        raise
                    pool.checkin(conn, broken=False)
                    return result
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc

    async def _run(self, name: str, params: Mapping[str, object], *, idempotent: bool) -> _Result:
        if not self._schema_ready:
            await self._ensure_schema()
        return await self._call(self._queries[name].text, params, idempotent=idempotent)

    def _ids(self, key: str) -> tuple[str, str]:
        """The key's id in hex (the statements UNHEX it) and the prefixed key."""
        full = self._prefix + key
        return key_id(full).hex(), full

    def _wake(self, ident: str) -> None:
        for watch in tuple(self._watches.get(ident, ())):
            watch.fire()

    def _maybe_purge(self) -> None:
        """Start a small background purge when ``purge_interval`` has passed since the last."""
        if self._purge_interval is None or self._purge_task is not None or self._closed:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now < self._next_purge:
            return
        self._next_purge = now + self._purge_interval
        self._purge_task = loop.create_task(self._purge_once())

    async def _purge_once(self) -> None:
        try:
            await self._purge_batches(once=True)
        except Exception as exc:  # noqa: BLE001 - opportunistic: the next one will try again
            logger.debug("asynclock: background purge of expired rows failed: %r", exc)
        finally:
            self._purge_task = None

    async def _purge_batches(self, *, once: bool) -> int:
        total = 0
        jobs: tuple[tuple[str, dict[str, object]], ...] = (
            ("purge_locks", {"retention_ms": self._retention_ms, "batch": _PURGE_BATCH}),
            ("purge_dedupe", {"batch": _PURGE_BATCH}),
        )
        for name, params in jobs:
            while True:
                deleted, _, _ = await self._run(name, params, idempotent=True)
                total += deleted
                if once or deleted < _PURGE_BATCH:
                    break
        return total

    # -- the State protocol -----------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire` (``acquire`` in ``queries.sql``).

        Atomic against every client of the database; expiry by the server's clock.
        """
        check_key(key)
        ident, full = self._ids(key)
        if waiting:
            # before the statement: if it is cancelled it may still land and flag the key
            self._flagged.add(ident)
        _, answer, _ = await self._run(
            "acquire",
            {
                "id": ident,
                "name": full,
                "owner": owner,
                "mark": mark_of(owner),
                "ttl_ms": ttl_ms(check_ttl(ttl, key=key)),
                "waiter": self._process if waiting else None,
            },
            idempotent=True,
        )
        self._maybe_purge()
        if answer >= _TOKEN_FLOOR:
            self._flagged.discard(ident)
            return Grant(answer)
        return Grant(None, answer / 1000.0)

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release` (``release`` in ``queries.sql``).

        Atomic compare-and-release (or handoff to ``successor``); a release wakes the watchers
        of this state at once.
        """
        ident, _ = self._ids(key)
        handoff = bool(successor and ttl)
        matched, token, _ = await self._run(
            "release",
            {
                "id": ident,
                "owner": owner,
                "successor": successor if handoff else None,
                "successor_mark": mark_of(successor) if successor and handoff else None,
                "successor_ttl_ms": ttl_ms(ttl) if ttl and handoff else 0,
                "reservation_ms": self._reservation_ms,
            },
            idempotent=False,
        )
        if not matched:
            return Release(owned=False)
        if token > 0:
            return Release(owned=True, handoff_token=token)
        self._wake(ident)
        return Release(owned=True)

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.State.abandon` (``abandon`` in ``queries.sql``).

        Releases the key if ``owner`` holds it, else marks ``owner`` so its acquire, should it
        still arrive, fails; the mark lives ``max(2 * op_timeout, 2)`` seconds. Atomic.
        """
        ident, full = self._ids(key)
        _, released, _ = await self._run(
            "abandon",
            {
                "id": ident,
                "name": full,
                "owner": owner,
                "mark": mark_of(owner),
                "mark_ttl_ms": self._mark_ttl_ms,
                "reservation_ms": self._reservation_ms,
            },
            idempotent=True,
        )
        if released == 1:
            self._wake(ident)

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.extend`: atomic compare-then-reset of the TTL."""
        ident, _ = self._ids(key)
        matched, _, _ = await self._run(
            "extend",
            {"id": ident, "owner": owner, "ttl_ms": ttl_ms(check_ttl(ttl, key=key))},
            idempotent=True,
        )
        return matched > 0

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect` (one read, server clock)."""
        ident, _ = self._ids(key)
        _, _, rows = await self._run("inspect", {"id": ident}, idempotent=True)
        if not rows:
            return None
        owner, remaining_us, token = rows[0][0], rows[0][1], rows[0][2]
        assert isinstance(owner, bytes)
        assert isinstance(token, int)
        remaining = max(int(remaining_us), 0) / 1e6 if isinstance(remaining_us, int) else 0.0
        return LockInfo(key, owner.decode(), remaining, token)

    async def dedupe_add(self, key: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.dedupe_add`: atomic insert-if-absent, server clock."""
        check_key(key)
        ident, full = self._ids(key)
        _, claimed, _ = await self._run(
            "dedupe_add",
            {"id": ident, "name": full, "ttl_ms": ttl_ms(check_ttl(ttl, key=key))},
            idempotent=False,
        )
        self._maybe_purge()
        return claimed > 0

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget` (one DELETE)."""
        ident, _ = self._ids(key)
        deleted, _, _ = await self._run("dedupe_forget", {"id": ident}, idempotent=False)
        return deleted > 0

    @contextlib.asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[PollingWatch]:
        """See :meth:`asynclock.state.State.watch`; waiting across processes polls (see module).

        Active at once: releases through this state are delivered directly, and waiters of other
        states re-check the key after each back-off.
        """
        ident, _ = self._ids(key)
        watch = PollingWatch(asyncio.get_running_loop())
        payload = ident
        self._watches.setdefault(payload, set()).add(watch)
        try:
            await asyncio.sleep(0)
            yield watch
        finally:
            watches = self._watches.get(payload)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[payload]
            if not self._watches.get(payload) and payload in self._flagged:
                # the last local waiter left without the lock: give the turn back
                self._flagged.discard(payload)
                params = {"id": ident, "waiter": self._process}
                await _quietly(self._run("unflag", params, idempotent=True))

    async def purge_expired(self) -> int:
        """Delete expired dedupe records and lock rows free for over ``token_retention`` seconds.

        Runs in batches (each one short statement) until nothing is left; returns the number of
        rows deleted. A purged key's next token still exceeds its old ones (the clock seed).
        """
        return await self._purge_batches(once=False)


async def _quietly(work: Awaitable[object]) -> None:
    """Run best-effort clean-up ``work`` to its end; failures are logged, never raised.

    A cancellation meanwhile is held back until the clean-up is done (it is one bounded
    statement), then raised.
    """
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:  # noqa: PERF203 - rare: a second cancellation
            cancelled = True
    if not task.cancelled() and task.exception() is not None:
        logger.debug("asynclock: clean-up failed: %r", task.exception())
    if cancelled:
        raise asyncio.CancelledError


async def _execute(conn: _Connection, sql: str, params: Mapping[str, object] | None) -> _Result:
    cursor = await conn.cursor()
    try:
        await cursor.execute(sql, params)
        rows = await cursor.fetchall()
        return cursor.rowcount, cursor.lastrowid or 0, rows or ()
    finally:
        await cursor.close()


def _code(exc: BaseException) -> int:
    code = exc.args[0] if exc.args else 0
    return code if isinstance(code, int) else 0


def _is_statement_error(exc: BaseException) -> bool:
    """A server error packet about the statement: the connection stays in sync and usable."""
    return isinstance(exc, mysql_errors.MySQLError) and 0 < _code(exc) < _CLIENT_ERROR_CODES


def _discard(conn: _Connection) -> None:
    conn.close()


async def _close(conn: _Connection) -> None:
    try:
        async with deadline_after(1.0):
            await conn.ensure_closed()
    except Exception:  # noqa: BLE001 - the socket goes anyway
        conn.close()
