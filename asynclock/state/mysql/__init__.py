"""MySQLState: locks, dedupe records and the inbox in MySQL 8 / MariaDB 10.6+, through aiomysql.

Every operation is one statement of ``queries.sql`` run in autocommit mode (one transaction),
so it is atomic against every client of the database and uses the server's clock
(``UTC_TIMESTAMP(3)``, never the session-time-zone ``NOW()``). The tables come from
``schema.sql``; keys are stored as the SHA-256 of ``prefix + key`` (the primary key) next to the
key itself, so keys of any length and characters fit. What does not depend on aiomysql lives in
:class:`asynclock.state.sql._state.SQLState`.

Wake-ups: MySQL has no LISTEN/NOTIFY, so a release reaches other processes through the
server's named locks (:mod:`asynclock.state.mysql._wake`): a state that holds a contended key
also holds the key's wake name on a dedicated connection (its bell) and frees it right after the
release commits; a state waiting for the key blocks in ``GET_LOCK`` of that name on another
dedicated connection (its ear), then re-checks the key. A release wakes the waiters of the same
state at once. Where the push path does not reach (the ear waits for another key, a connection
is down, the holder does not ring), a waiter re-checks after a bounded back-off (5 ms, doubling
up to 100 ms, never past the holder's remaining TTL): see :class:`PollingWatch`. The durable
inbox's hand-out and the semaphore waiters reach other processes another way, an *ear* (a
connection of its own waiting in a ``GET_LOCK`` that a procedure interrupts with ``KILL QUERY``,
``_ear.py``): each serving worker has one, which an accept for a free key interrupts; each state
whose semaphore waiters wait has one, which a release interrupts when it makes one of them
eligible (``_semaphore_ear.py``).

Size: just over 500 lines: the driver's part of a SQL state (answers, errors, the pool), its
URL options, and the wiring of the bell, the ears and the semaphore ear into the state's
lifecycle; each mechanism itself is a module of its own (``_wake.py``, ``_ear.py``,
``_semaphore_ear.py``, ``_supersede.py``), and what is left is one class's glue.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

import aiomysql  # type: ignore[import-untyped]
from pymysql import err as mysql_errors  # type: ignore[import-untyped]
from pymysql.constants import CLIENT  # type: ignore[import-untyped]

from asynclock._cancel import kept_cancellation
from asynclock._compat import deadline_after
from asynclock._errors import StateUnavailableError
from asynclock._validate import check_seconds
from asynclock.state._pool import ConnectionPool
from asynclock.state._protocol import Grant, LockInfo, Release
from asynclock.state._url import StateURL, redact
from asynclock.state._watch import TokenWatch, registered
from asynclock.state.mysql._ear import Anchor, InboxEar
from asynclock.state.mysql._semaphore_ear import EarWatch, SemaphoreEar
from asynclock.state.mysql._supersede import SupersedeEar
from asynclock.state.mysql._wake import PollingWatch, PushWatch, WakeChannel
from asynclock.state.sql._inbox import SQLInboxState
from asynclock.state.sql._options import (
    DEFAULT_OP_TIMEOUT,
    check_connect_options,
    check_max_connections,
)
from asynclock.state.sql._semaphore import SQLSemaphoreState
from asynclock.state.sql._state import PURGE_BATCH

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence

    from typing_extensions import Unpack

    from asynclock.state.sql._handout import HintWatch
    from asynclock.state.sql._options import SQLOptions
    from asynclock.state.sql._queries import Query

__all__ = ["MySQLState", "PollingWatch"]

#: server errors after which the whole statement was rolled back and may simply run again
_ROLLED_BACK_CODES = frozenset({1213, 1205})  # deadlock victim, lock wait timeout
#: below this, a MySQL error code comes from the server (an error packet: the stream is in
#: sync); 2000 and up are client errors (lost connection, ...)
_CLIENT_ERROR_CODES = 2000
#: every fencing token is at least this (microseconds since 1970 at any date after 2001):
#: ``acquire`` answers smaller numbers for "held, this many milliseconds left"
_TOKEN_FLOOR = 10**15
#: ``release``'s lastrowid when it freed a key that another state waits for (flagged)
_WAITER_FLAGGED = 1
#: ``abandon``'s answer (``LAST_INSERT_ID``) has this bit set when it freed the key
_FREED = 4
#: milliseconds a supersede_ears row outlives a state that crashed while listening
_EAR_LEASE_MS = 86_400_000


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


#: one statement's answer: (rowcount, lastrowid, rows)
_Result = tuple[int, int, "Sequence[Sequence[object]]"]


class MySQLState(
    SQLSemaphoreState[_Connection, str, _Result], SQLInboxState[_Connection, str, _Result]
):
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
    * A statement interrupted by a cancellation or a timeout may or may not have committed; its
      connection is discarded, never reused.
    * A waiter in another process is woken by the holder's bell (a named lock freed after the
      release) once the key is contended (see :meth:`acquire`); where that does not reach, it
      polls with a bounded back-off (:class:`PollingWatch`). An inbox worker is woken by the
      ``KILL QUERY`` of its own ear's wait, and so are the semaphore waiters of a state
      (one ear per state, interrupted by the release that makes one of them eligible). None of
      them ever blocks a pooled connection: the bell, the ears are connections of their own.
    * The durable inbox's accept, step and requeue are each one ``CALL`` of a stored procedure
      running one transaction (see :class:`~asynclock.state.sql._inbox.SQLInboxState`).

    One MySQLState serves one event loop (aiomysql connections belong to a loop). Build it with
    :meth:`from_url`.

    Args:
        connect: opens one new aiomysql connection (``from_url`` supplies it).
        where: how ``repr`` and error messages name the server (no password).
        max_connections: the most connections the state opens.
        options: the options of every SQL state (``prefix``, ``op_timeout``, ...; see
            :class:`~asynclock.state.sql._state.SQLState`).
    """

    _BACKEND = "MySQL"
    _PACKAGE = __name__
    # no multi-statement DELETE: the permits and places, then the rows they left unused
    _SEMAPHORE_PURGES = (
        "purge_semaphore_holders",
        "purge_semaphore_waiters",
        "purge_semaphores",
        "purge_semaphore_ears",
    )
    _UNAVAILABLE = (
        mysql_errors.OperationalError,  # 2003 cannot connect, 2006/2013 gone, 1205 lock wait, ...
        mysql_errors.InterfaceError,  # the connection is closed
        EOFError,  # asyncio.IncompleteReadError: the server closed it mid-reply (KILL)
        ConnectionError,
        OSError,
    )

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, _Connection]],
        *,
        where: str = "MySQL",
        max_connections: int = 10,
        **options: Unpack[SQLOptions],
    ) -> None:
        connect = _keeping_cancellation(connect)
        pool = ConnectionPool(
            connect, _discard, _close, check_max_connections(max_connections), alive=_alive
        )
        super().__init__(pool, where=where, **options)
        #: opens a connection outside the pool (the wake-up bell and ear, each inbox worker's ear)
        self._connect_dedicated = connect
        # two connections of its own, outside the pool: nothing a waiter blocks on is pooled
        self._wake_channel = WakeChannel(
            connect, table_prefix=self._table_prefix, op_timeout=self._op_timeout
        )
        #: SupersedeSignals: the state's supersede ear (opened on first use), and the holders'
        #: watches by the key's id in hex
        self._supersede_ear: SupersedeEar | None = None
        self._supersede_opening = asyncio.Lock()
        self._supersede_watches: dict[str, set[TokenWatch]] = {}
        #: what every ear of the state (semaphore, supersede, inbox workers') waits on
        self._ear_anchor = Anchor(connect, op_timeout=self._op_timeout or DEFAULT_OP_TIMEOUT)
        #: the semaphore waiters' ear, opened on their first wait
        self._semaphore_ears = SemaphoreEar(
            connect,
            (self._statements["semaphore_ear"], self._statements["semaphore_heard"]),
            wake=self._wake,
            wake_all=self._wake_semaphore_waiters,
            anchor=self._ear_anchor,
            op_timeout=self._op_timeout or DEFAULT_OP_TIMEOUT,
        )
        self._semaphore_ears_started = False
        self._semaphore_ears_opening = asyncio.Lock()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: float = 5.0,
        max_connections: int = 10,
        **options: Unpack[SQLOptions],
    ) -> MySQLState:
        """Build a state with its own connections from ``mysql://user:password@host:port/db``.

        ``?unix_socket=/path`` connects through a socket instead of TCP. Connections use
        utf8mb4, autocommit, ``READ COMMITTED`` (fewer gap locks between concurrent upserts)
        and ``CLIENT_FOUND_ROWS`` (rowcount counts matched rows). At most ``max_connections``
        are open for operations; a burst waits for a free one within ``op_timeout``. Two more,
        never pooled, carry the lock's cross-process wake-ups once the state waits or holds a
        contended key (see :mod:`asynclock.state.mysql._wake`); one more, the semaphore
        waiters' ear, once a semaphore waiter of the state waits (``_semaphore_ear.py``), one
        per worker serving the durable inbox, one for supersede signals, and one idle *anchor*
        that every ear of the state waits on (``_ear.py``).
        """
        parsed = StateURL(url)
        if parsed.scheme != "mysql":
            raise ValueError(f"not a MySQL URL: {redact(url)!r}")
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"invalid MySQL URL {redact(url)!r}: {exc}") from None
        database = unquote(parts.path.lstrip("/"))
        if not database:
            raise ValueError(f"the MySQL URL names no database: {redact(url)!r}")
        query = dict(parse_qsl(parts.query))
        connect = check_connect_options(connect_timeout, max_connections)
        op_timeout = check_seconds(options.get("op_timeout", DEFAULT_OP_TIMEOUT), "op_timeout")
        lock_wait = max(1, round(op_timeout or 1))
        settings: dict[str, object] = {
            "host": parts.hostname or "127.0.0.1",
            "port": port or 3306,
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
            settings["unix_socket"] = query["unix_socket"]

        async def open_connection() -> _Connection:
            conn: _Connection = await aiomysql.connect(**settings)
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
            max_connections=max_connections,
            **options,
        )

    # -- the driver's part ------------------------------------------------------------------

    def _prepare(self, query: Query) -> str:
        return query.text

    def _schema(self, statements: list[str]) -> list[str]:
        # a procedure's body comes between $$ marks (see load_schema), which MySQL does not know
        return [statement.replace("$$", "") for statement in statements]

    async def _execute(
        self, conn: _Connection, statement: str, params: Mapping[str, object]
    ) -> _Result:
        cursor = await conn.cursor()
        try:
            await cursor.execute(statement, params or None)
            rows = await cursor.fetchall()
            return cursor.rowcount, cursor.lastrowid or 0, rows or ()
        finally:
            await cursor.close()

    def _is_statement_error(self, exc: BaseException) -> bool:
        return isinstance(exc, mysql_errors.MySQLError) and 0 < _code(exc) < _CLIENT_ERROR_CODES

    def _rolled_back_whole(self, exc: BaseException) -> bool:
        return _code(exc) in _ROLLED_BACK_CODES

    @staticmethod
    def _id_param(ident: bytes) -> object:
        return ident.hex()  # the statements UNHEX it

    def _grant(self, answer: _Result) -> Grant:
        value = answer[1]
        if value >= _TOKEN_FLOOR:
            return Grant(value)
        return Grant(None, value / 1000.0)

    def _release(self, answer: _Result) -> Release:
        matched, token, _ = answer
        if not matched:
            return Release(owned=False)
        if token >= _TOKEN_FLOOR:
            return Release(owned=True, handoff_token=token)
        return Release(owned=True)

    def _freed(self, answer: _Result) -> bool:
        return bool(answer[1] & _FREED)

    def _matched(self, answer: _Result) -> bool:
        return answer[0] > 0

    def _held(self, answer: _Result) -> list[tuple[str, str, float, int]]:
        return [
            (
                _text(row[0]),
                _text(row[1]),
                max(int(str(row[2])), 0) / 1e6,
                int(str(row[3])),
            )
            for row in answer[2]
        ]

    def _lock_info(self, key: str, answer: _Result) -> LockInfo | None:
        rows = answer[2]
        if not rows:
            return None
        owner, remaining_us, token = rows[0][0], rows[0][1], rows[0][2]
        assert isinstance(owner, bytes)
        assert isinstance(token, int)
        remaining = max(int(remaining_us), 0) / 1e6 if isinstance(remaining_us, int) else 0.0
        return LockInfo(key, owner.decode(), remaining, token)

    def _claimed(self, answer: _Result) -> bool:
        return answer[1] > 0

    def _remaining(self, answer: _Result) -> float | None:
        rows = answer[2]
        if not rows:
            return None
        remaining_us = rows[0][0]
        return max(int(remaining_us), 0) / 1e6 if isinstance(remaining_us, int) else 0.0

    def _deleted(self, answer: _Result) -> int:
        return answer[0]

    def _rows(self, answer: _Result) -> Sequence[Sequence[object]]:
        return answer[2]

    @contextlib.asynccontextmanager
    async def _wake_ups(self, worker: str, channel: str) -> AsyncIterator[HintWatch]:
        """See :meth:`SQLInboxState._wake_ups`: the worker's ear (``_ear.py``), a connection of
        its own that an accept's ``KILL QUERY`` interrupts; its id is what the row names."""
        if not self._schema_ready:
            await self._ensure_schema()
        ear = InboxEar(
            self._connect_dedicated,
            (self._statements["inbox_ear"], self._statements["inbox_ear_moved"]),
            worker=worker,
            anchor=self._ear_anchor,
            op_timeout=self._op_timeout or DEFAULT_OP_TIMEOUT,
        )
        async with self._guard():
            watch = await ear.start()
        self._worker_watches[worker] = watch
        try:
            yield watch
        finally:
            self._worker_watches.pop(worker, None)
            await ear.aclose()

    def _new_watch(self, loop: asyncio.AbstractEventLoop) -> PollingWatch:
        return PollingWatch(loop)

    def _new_key_watch(self, loop: asyncio.AbstractEventLoop, ident: str) -> PushWatch:
        return PushWatch(loop, self._wake_channel, ident)

    def _released_here(self, ident: str) -> None:
        super()._released_here(ident)
        self._wake_channel.released(ident)  # the other states hear it through the wake name

    async def _stop_listening(self) -> None:
        await self._wake_channel.aclose()
        await self._semaphore_ears.aclose()
        ear, self._supersede_ear = self._supersede_ear, None
        if ear is not None:
            await ear.aclose()
        self._ear_anchor.aclose()

    # -- supersede signals: supersede_v1 kills the query of the holder's ear ----------------

    async def supersede(self, key: str, token: int) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede` (one ``CALL`` of
        ``supersede_v1``: ``KILL QUERY`` of the listening ears, if ``token`` holds the key)."""
        ident, _ = self._ids(key)
        await self._run("supersede", {"id": ident.hex(), "token": int(token)}, idempotent=True)

    @contextlib.asynccontextmanager
    async def supersede_watch(self, key: str) -> AsyncIterator[TokenWatch]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_watch`: a row naming this
        state's supersede ear (``_supersede.py``) for the key while any watch of it is open."""
        ident, _ = self._ids(key)
        hex_id = ident.hex()
        ear = await self._open_supersede_ear()
        watch = TokenWatch(asyncio.get_running_loop())
        params = {"id": hex_id, "conn": ear.conn}
        try:
            with registered(self._supersede_watches, hex_id, watch):
                await self._run(
                    "supersede_listen", {**params, "lease_ms": _EAR_LEASE_MS}, idempotent=True
                )
                yield watch
        finally:
            if hex_id not in self._supersede_watches:  # the key's last watch is gone
                with contextlib.suppress(StateUnavailableError):  # the lease ends it
                    await self._run("supersede_unlisten", params, idempotent=True)

    async def _open_supersede_ear(self) -> SupersedeEar:
        async with self._supersede_opening:
            if self._supersede_ear is None:
                if not self._schema_ready:
                    await self._ensure_schema()
                ear = SupersedeEar(
                    self._connect_dedicated,
                    self._statements,
                    self._superseded,
                    anchor=self._ear_anchor,
                    op_timeout=self._op_timeout or DEFAULT_OP_TIMEOUT,
                )
                async with self._guard():
                    await ear.start()
                self._supersede_ear = ear
            return self._supersede_ear

    def _purge_jobs(self) -> tuple[tuple[str, dict[str, object]], ...]:
        return (*super()._purge_jobs(), ("purge_supersede_ears", {"batch": PURGE_BATCH}))

    def _superseded(self, hex_id: str, token: int) -> None:
        for watch in tuple(self._supersede_watches.get(hex_id, ())):
            watch.heard(str(token))

    # -- the semaphore waiters' ear (_semaphore_ear.py) --------------------------------------

    def _semaphore_ear(self) -> int | None:
        return self._semaphore_ears.channel

    async def _semaphore_listen(self) -> None:
        """The ear open (within ``op_timeout``) before the first watch is handed out; later,
        while it is down, the watches poll and it reopens by itself."""
        if self._semaphore_ears_started or self._closed:
            await asyncio.sleep(0)
            return
        if not self._schema_ready:
            await self._ensure_schema()
        async with self._semaphore_ears_opening, self._guard():
            if not self._semaphore_ears_started:
                await self._semaphore_ears.start()
                self._semaphore_ears_started = True

    def _new_semaphore_watch(self, loop: asyncio.AbstractEventLoop) -> EarWatch:
        return EarWatch(loop, self._semaphore_ears)

    # -- wake names around the lock statements ----------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`SQLState.acquire`; also holds the key's wake name when it is contended.

        A ``waiting`` attempt that fails makes the key hot for this state; once it takes a hot
        key, its bell holds the key's wake name until it frees the key (see
        :mod:`asynclock.state.mysql._wake`), so the other states' ears hear the release.
        """
        grant = await super().acquire(key, owner, ttl, waiting=waiting)
        channel = self._wake_channel
        if waiting or channel.hot:
            ident = self._ids(key)[0].hex()
            if grant.token is not None:
                channel.acquired(ident)
            elif waiting:
                channel.waited(ident)
        return grant

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`SQLState.release`; a release that frees the key rings its wake name.

        So does one that finds the key no longer ours (expired, taken): this state must stop
        holding the wake name of a key it does not hold.
        """
        ident, _ = self._ids(key)
        raw = await self._run(
            "release", self._release_params(ident, owner, successor, ttl), idempotent=False
        )
        answer = self._release(raw)
        if answer.handoff_token is None:
            hex_id = ident.hex()
            if raw[1] == _WAITER_FLAGGED:
                self._wake_channel.waited(hex_id)  # another state waits: ring for it next time
            if answer.owned:
                self._released_here(hex_id)
            else:
                self._wake_channel.released(hex_id)
        return answer


def _code(exc: BaseException) -> int:
    code = exc.args[0] if exc.args else 0
    return code if isinstance(code, int) else 0


def _keeping_cancellation(
    connect: Callable[[], Coroutine[object, object, _Connection]],
) -> Callable[[], Coroutine[object, object, _Connection]]:
    """``connect``, raising a cancellation aiomysql's connect lost (its ``asyncio.wait_for``
    before Python 3.12: see :func:`asynclock._compat.kept_cancellation`)."""

    async def opened() -> _Connection:
        return await kept_cancellation(connect(), _discard)

    return opened


def _discard(conn: _Connection) -> None:
    conn.close()


async def _close(conn: _Connection) -> None:
    try:
        async with deadline_after(1.0):
            await conn.ensure_closed()
    except Exception:  # noqa: BLE001 - the socket goes anyway
        conn.close()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _alive(conn: aiomysql.Connection) -> bool:
    """Whether the server's end of an idle connection is still open (no round trip): the EOF
    of a connection the server closed reaches its stream reader without anyone reading."""
    reader = getattr(conn, "_reader", None)
    return not conn.closed and reader is not None and not reader.at_eof()
