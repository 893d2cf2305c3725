"""PostgresState: locks, dedupe records and the durable inbox in PostgreSQL, through asyncpg.

Every operation is one statement of ``queries.sql`` run in autocommit mode (one transaction),
so it is atomic against every client of the database and uses the server's clock (``now()``).
The tables come from ``schema.sql`` (``{table_prefix}locks`` and ``{table_prefix}dedupe``);
keys are stored as the SHA-256 of ``prefix + key`` (the primary key) next to the key itself,
so keys of any length and characters fit. What does not depend on asyncpg lives in
:class:`asynclock.state.sql._state.SQLState`.

Wake-ups: a release of a key that a waiting state flagged runs ``pg_notify`` in its own
transaction (an unflagged release wakes only this state's own watchers, in process: a NOTIFY
serialises the commits that send it); one dedicated connection per state LISTENs on the table's
channel (``{table_prefix}released``, payload: the key's id in hex) and wakes the watchers of
that key. An inbox accept for a free key wakes one serving worker through its ear (a
connection of its own on the listener's address, its ``pg_sleep`` cancelled: ``_ear.py``), or,
if that cannot be done, by a NOTIFY on the worker's channel, heard by the same LISTEN
connection. Pooled connections
never LISTEN and never hold session state, so they stay safe behind PgBouncer in transaction
mode (the listener needs a direct or session-mode connection).

Size: over 500 lines on purpose: the driver's part of a SQL state (answers, errors, pools),
its URL options, and the wiring of the wake-ups (release, supersede, inbox hand-out) into the
state; the LISTEN connection itself is ``_listener.py``, the ear ``_ear.py``, the options
parsing for poolers ``_pooler.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol
from urllib.parse import parse_qsl, urlsplit

import asyncpg  # type: ignore[import-untyped]
from asyncpg import exceptions as pg_errors

from asynclock._validate import check_key, check_ttl, ttl_ms
from asynclock.state._pool import ConnectionPool, ConnectionSource
from asynclock.state._protocol import Grant, LockInfo, Release
from asynclock.state._url import StateURL, redact
from asynclock.state._watch import EventWatch, TokenWatch, registered
from asynclock.state.postgres._connection import Connection as _Connection
from asynclock.state.postgres._connection import Record as _Record
from asynclock.state.postgres._ear import PostgresEar
from asynclock.state.postgres._listener import Listener, ListenerHooks
from asynclock.state.postgres._pooler import pooler_options
from asynclock.state.sql._handout import HintWatch
from asynclock.state.sql._inbox import SQLInboxState
from asynclock.state.sql._options import check_connect_options
from asynclock.state.sql._semaphore import SQLSemaphoreState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

    from typing_extensions import Unpack

    from asynclock.state.sql._options import SQLOptions
    from asynclock.state.sql._queries import Query

__all__ = ["PostgresState"]

logger = logging.getLogger("asynclock")


class _AsyncpgPool(Protocol):
    async def acquire(self) -> _Connection: ...
    async def release(self, conn: _Connection) -> None: ...


#: a statement: its text with $n placeholders and the parameter name of each $n; ``None``
#: names mark a script of several statements (the schema), run without parameters
_Statement = tuple[str, tuple[str, ...] | None]
_Rows = list[_Record]


def _check_ports(url: str) -> None:
    """Reject a malformed address or port now (asyncpg would only fail on the first connect,
    with an error that does not name the URL). Multi-host DSNs (``h1:5432,h2:5433``) pass."""
    try:
        hosts = urlsplit(url).netloc.rpartition("@")[2]
    except ValueError as exc:
        raise ValueError(f"invalid PostgreSQL URL {redact(url)!r}: {exc}") from None
    for host in hosts.split(","):
        port = host.rpartition("]")[2] if host.startswith("[") else host
        _, colon, number = port.rpartition(":")
        if colon and number and not (number.isdigit() and 0 < int(number) < 65536):
            raise ValueError(
                f"invalid PostgreSQL URL {redact(url)!r}: port must be 1-65535, got {number!r}"
            )


class PostgresState(
    SQLSemaphoreState[_Connection, _Statement, _Rows], SQLInboxState[_Connection, _Statement, _Rows]
):
    """Locks and dedupe records in PostgreSQL, shared by every process using the same database.

    Invariants:

    * Acquire, release, extend, abandon and dedupe are each one SQL statement in its own
      transaction, so atomic against every client; expiry is decided by the server's ``now()``,
      never by the client's clock.
    * Fencing tokens strictly increase per key: ``max(last + 1, server clock in µs)``; a lock row
      is kept after release (and purged ``token_retention`` seconds later at the earliest).
    * Every operation answers within ``op_timeout`` seconds (connection wait included) or raises
      :class:`~asynclock.StateUnavailableError`, chained to the driver's error.
    * A failed try-acquire and a duplicate dedupe are reads: they take no row lock and flush no
      WAL (see ``queries.sql``).
    * A statement interrupted by a cancellation or a timeout may or may not have committed; its
      connection is discarded, never reused.
    * A :class:`~asynclock.state.ClaimingState`: the dispatcher's dedupe claim rides on the
      acquire and release statements (two statements per fresh event). A statement that locks a
      claim's dedupe row and a lock row always locks the dedupe row first, so two of them never
      wait for each other in a cycle (see ``queries.sql``); a deadlock victim of any other cycle
      (its whole transaction rolled back, nothing left behind) is run again.
    * The durable inbox's accept, step and requeue are each one call of a PL/pgSQL function
      running one transaction (see :class:`~asynclock.state.sql._inbox.SQLInboxState`); an
      accept for a free key wakes one serving worker, through its ear (``_ear.py``), by
      ``NOTIFY`` only if it may not cancel the ear's sleep.

    One PostgresState serves one event loop (asyncpg connections belong to a loop).

    Args:
        pool: an ``asyncpg.Pool`` to run statements on; the state never closes it. Each operation
            then pays the pool's reset query on release; :meth:`from_url` builds a leaner pool.
            The listener for wake-ups holds one connection of the pool while any key is watched,
            and each serving inbox worker's ear one more (through a transaction pooler its pid
            is the pooler's: wake-ups then fall back to ``NOTIFY``).
        options: the options of every SQL state (``prefix``, ``op_timeout``, ...; see
            :class:`~asynclock.state.sql._state.SQLState`).
    """

    _BACKEND = "PostgreSQL"
    _PACKAGE = __name__
    _UNAVAILABLE = (
        pg_errors.PostgresConnectionError,
        pg_errors.OperatorInterventionError,  # shutdown, "cannot connect now", statement_timeout
        pg_errors.TooManyConnectionsError,
        pg_errors.InterfaceError,  # "connection is closed"
        # the protocol state of a connection the server terminated mid-exchange
        pg_errors.InternalClientError,
        ConnectionError,
        OSError,
    )

    def __init__(self, pool: object, **options: Unpack[SQLOptions]) -> None:
        self._connect_listener: Callable[[], Awaitable[_Connection]]
        self._release_listener: Callable[[_Connection], Awaitable[None]]
        if isinstance(pool, _OwnConnections):  # from_url's
            super().__init__(pool.source, where=pool.where, **options)
            self._connect_listener, self._release_listener = pool.connect_listener, _close
        else:
            source = _UserPool(pool) if pool is not None else _NoSource()
            super().__init__(source, where="PostgreSQL (given pool)", **options)
            self._connect_listener = self._listener_from_pool(pool)
            self._release_listener = self._give_back(pool)
        self._listener: Listener | None = None
        #: SupersedeSignals: NOTIFY channel, and the holders' watches by the key's id in hex
        self._supersede_channel = f"{self._table_prefix}supersede"
        self._supersede_watches: dict[str, set[TokenWatch]] = {}
        #: the ear of each serving worker of this state, by worker id
        self._ears: dict[str, PostgresEar] = {}

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        connect_timeout: float = 5.0,
        max_connections: int = 10,
        durable: bool = True,
        application_name: str | None = None,
        listen_url: str | None = None,
        statement_cache_size: int | None = None,
        **options: Unpack[SQLOptions],
    ) -> PostgresState:
        """Build a state with its own connections from a ``postgresql://`` or ``postgres://`` URL.

        The URL is handed to asyncpg as a DSN (user, password, host, port, database and query
        options such as ``sslmode``). The state opens at most ``max_connections`` connections for
        statements, plus one listener connection once a key is watched and one ear connection
        per serving inbox worker (both on ``listen_url``), each within
        ``connect_timeout`` seconds. A burst of operations larger than the pool waits for a free
        connection (within ``op_timeout``) instead of failing.

        ``durable=False`` sets ``synchronous_commit = off`` on these connections: a commit no
        longer waits for its WAL flush (more lock operations per second), and a server crash
        may forget the last fraction of a second of lock changes (see
        ``docs/backends-sql.md``). The default keeps the server's own setting.

        ``application_name`` is what the connections show in ``pg_stat_activity`` (and the
        server log), so an operator can find, or terminate, the sessions of one application:
        by default the URL's ``?application_name=``, else ``"asynclock"``.

        Behind a transaction-mode pooler (PgBouncer ``pool_mode = transaction``), give the
        listener a direct or session-mode ``listen_url`` (default: ``url``; a LISTEN through
        transaction pooling hears nothing) and ``statement_cache_size=0`` (asyncpg's named
        prepared statements do not survive the move to another server connection; ``None``
        keeps asyncpg's default). Both may also be query parameters of ``url`` (see
        :mod:`asynclock.state.postgres._pooler` and ``docs/backends-sql.md``).
        """
        parsed = StateURL(url)
        if parsed.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"not a PostgreSQL URL: {redact(url)!r}")
        pooler = pooler_options(url, listen_url, statement_cache_size)
        _check_ports(pooler.dsn)
        _check_ports(pooler.listen_dsn)
        connect = check_connect_options(connect_timeout, max_connections)
        if application_name is None:
            application_name = dict(parse_qsl(urlsplit(url).query)).get(
                "application_name", "asynclock"
            )
        elif not isinstance(application_name, str):
            raise TypeError(
                f"application_name must be a str, got {type(application_name).__name__}"
            )
        # asyncpg lets server_settings override the DSN's own query options
        settings = {"application_name": application_name}
        if not durable:
            settings["synchronous_commit"] = "off"

        cache = {}
        if pooler.statement_cache_size is not None:
            cache["statement_cache_size"] = pooler.statement_cache_size

        def connector(dsn: str, **extra: int) -> Callable[[], Awaitable[_Connection]]:
            async def open_connection() -> _Connection:
                conn: _Connection = await asyncpg.connect(
                    dsn=dsn, timeout=connect, server_settings=settings, **extra
                )
                return conn

            return open_connection

        own = _OwnConnections(
            ConnectionPool(
                connector(pooler.dsn, **cache), _terminate, _close, max_connections, alive=_alive
            ),
            f"PostgreSQL at {redact(pooler.dsn)}",
            # the listener keeps asyncpg's statement cache: LISTEN is its only statement
            connector(pooler.listen_dsn),
        )
        return cls(own, **options)

    # -- the driver's part ------------------------------------------------------------------

    def _prepare(self, query: Query) -> _Statement:
        return query.dollar()

    def _schema(self, statements: list[str]) -> list[_Statement]:
        # One transaction under a transaction-level advisory lock: processes that start
        # together would otherwise race on the catalog ("duplicate key ... pg_type").
        script = "\n".join(
            [
                "BEGIN;",
                "SELECT pg_advisory_xact_lock(hashtextextended('asynclock schema', 0));",
                *(f"{statement};" for statement in statements),
                "COMMIT;",
            ]
        )
        return [(script, None)]

    async def _execute(
        self, conn: _Connection, statement: _Statement, params: Mapping[str, object]
    ) -> _Rows:
        sql, names = statement
        if names is None:
            await conn.execute(sql)  # the simple query protocol runs a script
            return []
        return await conn.fetch(sql, *[params[name] for name in names])

    _NO_CLAIM: ClassVar[Mapping[str, object]] = {
        "claim_id": None,
        "claim_name": None,
        "claim_ttl_ms": 0,
    }

    # -- ClaimingState: the claim rides on the acquire and release statements ---------------

    def _claim_params(self, claim: str, claim_ttl: float) -> dict[str, object]:
        check_key(claim)
        ident, full = self._ids(claim)
        return {
            "claim_id": self._id_param(ident),
            "claim_name": full,
            "claim_ttl_ms": ttl_ms(check_ttl(claim_ttl, key=claim)),
        }

    async def acquire_claimed(
        self, key: str, owner: str, ttl: float, *, claim: str, claim_ttl: float
    ) -> Grant | None:
        """See :meth:`asynclock.state.ClaimingState.acquire_claimed` (one statement).

        A first attempt: it never flags the key for a waiter. Not retried after a failure
        mid-statement (unlike ``acquire``): a claim that did land would make the retry look like
        a duplicate of itself.
        """
        params = self._acquire_params(key, owner, ttl) | self._claim_params(claim, claim_ttl)
        answer = await self._run("acquire", params, idempotent=False)
        self._maybe_purge()
        return self._grant(answer) if answer else None

    async def release_claimed(
        self,
        key: str,
        owner: str,
        *,
        claim: str,
        claim_ttl: float,
        successor: str | None = None,
        ttl: float | None = None,
    ) -> Release:
        """See :meth:`asynclock.state.ClaimingState.release_claimed` (one statement)."""
        return await self._release_with(
            key, owner, successor, ttl, self._claim_params(claim, claim_ttl)
        )

    async def forget_claimed(self, claim: str, owner: str) -> bool:
        """See :meth:`asynclock.state.ClaimingState.forget_claimed` (one DELETE)."""
        check_key(claim)
        ident, _ = self._ids(claim)
        answer = await self._run(
            "forget_claimed", {"id": self._id_param(ident), "owner": owner}, idempotent=False
        )
        return self._matched(answer)

    def _is_statement_error(self, exc: BaseException) -> bool:
        return isinstance(exc, pg_errors.PostgresError) and not isinstance(exc, self._UNAVAILABLE)

    def _rolled_back_whole(self, exc: BaseException) -> bool:
        # 40P01: the server broke a wait cycle by rolling this statement's transaction back
        return isinstance(exc, pg_errors.DeadlockDetectedError)

    def _never_sent(self, exc: BaseException) -> bool:
        # asyncpg checks its protocol state before it writes anything: a connection that has
        # read the server's "terminating connection" but not yet its end of stream is refused
        # here, so even a release (not safe to repeat blindly) can be retried on a new one
        return isinstance(exc, pg_errors.InternalClientError) and "cannot switch to state" in str(
            exc
        )

    def _grant(self, answer: _Rows) -> Grant:
        token, retry_after = answer[0][0], answer[0][1]
        if isinstance(token, int):
            return Grant(token)
        return Grant(None, float(retry_after) if isinstance(retry_after, float) else 0.0)

    def _release(self, answer: _Rows) -> Release:
        if not answer:
            return Release(owned=False)
        token, handed_over = answer[0][0], answer[0][1]
        if handed_over is True and isinstance(token, int):
            return Release(owned=True, handoff_token=token)
        return Release(owned=True)

    def _freed(self, answer: _Rows) -> bool:
        return bool(answer) and answer[0][0] is True

    def _matched(self, answer: _Rows) -> bool:
        return bool(answer)

    def _held(self, answer: _Rows) -> list[tuple[str, str, float, int]]:
        return [(str(r[0]), str(r[1]), float(str(r[2])), int(str(r[3]))) for r in answer]

    def _lock_info(self, key: str, answer: _Rows) -> LockInfo | None:
        if not answer:
            return None
        owner, remaining, token = answer[0][0], answer[0][1], answer[0][2]
        assert isinstance(owner, str)
        assert isinstance(token, int)
        return LockInfo(
            key, owner, float(remaining) if isinstance(remaining, float) else 0.0, token
        )

    def _claimed(self, answer: _Rows) -> bool:
        return bool(answer)

    def _remaining(self, answer: _Rows) -> float | None:
        if not answer:
            return None
        remaining = answer[0][0]
        return float(remaining) if isinstance(remaining, float) else 0.0

    def _deleted(self, answer: _Rows) -> int:
        deleted = answer[0][0]
        assert isinstance(deleted, int)
        return deleted

    def _rows(self, answer: _Rows) -> list[tuple[object, ...]]:
        return [tuple(record) for record in answer]

    # -- wake-ups: NOTIFY reaches every state, this one included (flagged releases) ---------

    def _new_watch(self, loop: asyncio.AbstractEventLoop) -> EventWatch:
        return EventWatch(loop)

    async def _listen(self) -> None:
        """Connected and LISTENing (within ``op_timeout``) before the watch is handed out.

        If the listener's connection drops, it reconnects in the background, and once it
        LISTENs again every watcher is woken (it re-checks the key: a release may have gone
        unheard meanwhile). Until then a watcher waits at most the holder's remaining TTL.
        """
        if self._listener is None:
            self._listener = Listener(
                ListenerHooks(
                    connect=self._connect_listener,
                    release=self._release_listener,
                    channels={
                        self._channel: self._wake,
                        self._supersede_channel: self._superseded,
                    },
                    worker_watches=self._worker_watches,
                    watched=self._watched,
                    wake_all=self._wake_all,
                    op_timeout=self._op_timeout,
                )
            )
        async with self._guard():
            await self._listener.ensure()
            await self._listener.listen()

    def _watched(self) -> bool:
        """Whether any key, worker or supersede signal is watched (the listener is needed)."""
        return bool(self._watches or self._worker_watches or self._supersede_watches)

    async def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.aclose()

    @contextlib.asynccontextmanager
    async def _wake_ups(self, worker: str, channel: str) -> AsyncIterator[HintWatch]:
        """See :meth:`SQLInboxState._wake_ups`: the worker's ear (``_ear.py``: a cancelled sleep,
        the key in the worker's row), and as its fallback a NOTIFY on ``channel`` (its payload:
        the key's id in hex), heard on this state's LISTEN connection: what a waker sends when
        it finds no ear at the row's pid, or may not cancel it (``pg_cancel_backend`` needs the
        ear's role or ``pg_signal_backend``, and seeing its query the same role or
        ``pg_read_all_stats``)."""
        watch = HintWatch(channel)
        self._worker_watches[channel] = watch
        sql, names = self._statements["inbox_ear"]
        assert names == ("worker", "wait")
        ear = PostgresEar(
            self._connect_listener,
            self._release_listener,
            sql,
            worker=worker,
            watch=watch,
            op_timeout=self._op_timeout,
        )
        try:
            # both connections at once (a worker starts serving one connect sooner), each done
            # before any failure is raised: an ear still opening would be left behind
            for outcome in await asyncio.gather(
                self._listen(), self._start_ear(ear), return_exceptions=True
            ):
                if isinstance(outcome, BaseException):
                    raise outcome
            self._ears[worker] = ear
            yield watch
        finally:
            self._ears.pop(worker, None)
            await ear.aclose()
            self._worker_watches.pop(channel, None)
            listener = self._listener
            if listener is not None:
                await listener.unlisten(channel)

    # -- supersede signals: a NOTIFY naming the key and the holder's token -----------------------

    async def supersede(self, key: str, token: int) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede` (one statement: a ``NOTIFY``
        if ``token`` still holds the key)."""
        ident, _ = self._ids(key)
        params = {
            "id": self._id_param(ident),
            "token": int(token),
            "channel": self._supersede_channel,
            "payload": f"{ident.hex()} {int(token)}",
        }
        await self._run("supersede", params, idempotent=True)

    @contextlib.asynccontextmanager
    async def supersede_watch(self, key: str) -> AsyncIterator[TokenWatch]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_watch` (the state's LISTEN
        connection, as for :meth:`watch`)."""
        ident, _ = self._ids(key)
        hex_id = ident.hex()
        watch = TokenWatch(asyncio.get_running_loop())
        with registered(self._supersede_watches, hex_id, watch):
            await self._listen()
            yield watch

    def _superseded(self, payload: str) -> None:
        hex_id, _, token = payload.partition(" ")
        for watch in tuple(self._supersede_watches.get(hex_id, ())):
            watch.heard(token)

    async def _start_ear(self, ear: PostgresEar) -> None:
        async with self._guard():
            await ear.start()

    def _worker_row(self, worker: str) -> Mapping[str, object]:
        # the session (pid) where the worker waits in inbox_ear (None: none now), see queries.sql
        ear = self._ears.get(worker)
        return {"ear": ear.pid if ear is not None else None}

    @staticmethod
    def _listener_from_pool(pool: object) -> Callable[[], Awaitable[_Connection]]:
        async def acquire() -> _Connection:
            if pool is None:
                raise RuntimeError("PostgresState has no connection source")
            user_pool: _AsyncpgPool = pool  # type: ignore[assignment]
            return await user_pool.acquire()

        return acquire

    @staticmethod
    def _give_back(pool: object) -> Callable[[_Connection], Awaitable[None]]:
        async def release(conn: _Connection) -> None:
            user_pool: _AsyncpgPool = pool  # type: ignore[assignment]
            with contextlib.suppress(Exception):
                await user_pool.release(conn)

        return release


@dataclass(frozen=True, slots=True)
class _OwnConnections:
    """The connections :meth:`PostgresState.from_url` opens, handed to the constructor as its
    ``pool``: the statements' pool, how errors name the server, the listener's connector."""

    source: ConnectionPool[_Connection]
    where: str
    connect_listener: Callable[[], Awaitable[_Connection]]


class _UserPool(ConnectionSource["_Connection"]):
    """A user's ``asyncpg.Pool`` as a source: connections go back to it; it is never closed."""

    def __init__(self, pool: object) -> None:
        self._pool: _AsyncpgPool = pool  # type: ignore[assignment]
        self._releases: set[asyncio.Task[None]] = set()

    async def checkout(self) -> tuple[_Connection, bool]:
        conn: _Connection = await self._pool.acquire()
        return conn, True

    def checkin(self, conn: _Connection | None, *, broken: bool) -> None:
        if conn is None:
            return
        if broken:
            conn.terminate()
        # asyncpg's release is a coroutine (it runs its reset query): do it in the background
        task = asyncio.get_running_loop().create_task(self._release(conn))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, conn: _Connection) -> None:
        with contextlib.suppress(Exception):
            await self._pool.release(conn)

    # discard_idle: none; the user's pool decides which of its connections to reuse

    async def aclose(self) -> None:
        if self._releases:
            await asyncio.wait(set(self._releases))


class _NoSource(ConnectionSource["_Connection"]):
    """No pool given: every operation says how to build a usable state."""

    async def checkout(self) -> tuple[_Connection, bool]:
        raise RuntimeError("PostgresState needs an asyncpg pool, or use PostgresState.from_url()")

    def checkin(self, conn: _Connection | None, *, broken: bool) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _terminate(conn: _Connection) -> None:
    conn.terminate()


async def _close(conn: _Connection) -> None:
    try:
        await conn.close(timeout=1.0)
    except Exception:  # noqa: BLE001 - the socket goes anyway
        conn.terminate()


def _alive(conn: asyncpg.Connection) -> bool:
    """Whether the server's end of an idle connection is still open (no round trip)."""
    return not conn.is_closed()
