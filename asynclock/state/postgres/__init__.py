"""PostgresState: locks and dedupe records in PostgreSQL tables, through asyncpg.

Every operation is one statement of ``queries.sql`` run in autocommit mode (one transaction),
so it is atomic against every client of the database and uses the server's clock (``now()``).
The tables come from ``schema.sql`` (``{table_prefix}locks`` and ``{table_prefix}dedupe``);
keys are stored as the SHA-256 of ``prefix + key`` (the primary key) next to the key itself,
so keys of any length and characters fit.

Wake-ups: a release runs ``pg_notify`` in its own transaction; one dedicated connection per
state LISTENs on the table's channel (``{table_prefix}released``, payload: the key's id in hex)
and wakes the watchers of that key. Pooled connections never LISTEN and never hold session
state, so they stay safe behind PgBouncer in transaction mode (the listener needs a direct or
session-mode connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

import asyncpg  # type: ignore[import-untyped]
from asyncpg import exceptions as pg_errors

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
    from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
    from types import TracebackType

    from typing_extensions import Self

    from asynclock._errors import StateUnavailableError

__all__ = ["PostgresState"]

logger = logging.getLogger("asynclock")

#: driver errors that mean "cannot reach the server / the connection is gone"
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    pg_errors.PostgresConnectionError,
    pg_errors.OperatorInterventionError,  # shutdown, "cannot connect now", statement_timeout
    pg_errors.TooManyConnectionsError,
    pg_errors.InterfaceError,  # "connection is closed"
    ConnectionError,
    OSError,
)
_UNAVAILABLE_OR_TIMEOUT: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE,
    TimeoutError,
    asyncio.TimeoutError,
)
#: a server error that leaves the connection usable (the statement failed, nothing else)
_STATEMENT_ERROR: type[BaseException] = pg_errors.PostgresError

_PURGE_BATCH = 500
_FIRST_RECONNECT_DELAY = 0.01
_MAX_RECONNECT_DELAY = 1.0


class _Record(Protocol):
    def __getitem__(self, index: int) -> object: ...


class _Connection(Protocol):
    """The part of ``asyncpg.Connection`` this module uses."""

    async def fetch(self, query: str, *args: object) -> list[_Record]: ...
    async def execute(self, query: str, *args: object) -> str: ...
    async def close(self, *, timeout: float | None = None) -> None: ...
    def terminate(self) -> None: ...
    def is_closed(self) -> bool: ...
    async def add_listener(
        self, channel: str, callback: Callable[[object, object, object, object], None]
    ) -> None: ...
    def add_termination_listener(self, callback: Callable[[object], None]) -> None: ...


class _Source(Protocol):
    """Where operations get a connection: this state's own pool, or a user's asyncpg pool."""

    async def checkout(self) -> tuple[_Connection, bool]: ...
    def checkin(self, conn: _Connection | None, *, broken: bool) -> None: ...
    async def aclose(self) -> None: ...


class _UserPool:
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

    async def aclose(self) -> None:
        if self._releases:
            await asyncio.wait(set(self._releases))


class _AsyncpgPool(Protocol):
    async def acquire(self) -> _Connection: ...
    async def release(self, conn: _Connection) -> None: ...


class PostgresState:
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

    One PostgresState serves one event loop (asyncpg connections belong to a loop).

    Args:
        pool: an ``asyncpg.Pool`` to run statements on; the state never closes it. Each operation
            then pays the pool's reset query on release; :meth:`from_url` builds a leaner pool.
            The listener for wake-ups holds one connection of the pool while any key is watched.
        prefix: put in front of every key, so applications sharing the tables never meet.
        table_prefix: put in front of the table names (a plain identifier).
        op_timeout: seconds one operation may take, connection wait included.
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
        pool: object,
        *,
        prefix: str = "asynclock:",
        table_prefix: str = "asynclock_",
        op_timeout: float = 5.0,
        create_schema: bool = True,
        token_retention: float = 60.0,
        reservation: float = 0.25,
        purge_interval: float | None = 60.0,
    ) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
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
        self._create_schema = bool(create_schema)
        self._schema_ready = not self._create_schema
        self._schema_lock = asyncio.Lock()
        self._where = "PostgreSQL (given pool)"
        self._process = new_process_id()
        self._channel = f"{self._table_prefix}released"
        self._queries = {
            name: query.dollar()
            for name, query in load_queries(__package__ or __name__, self._table_prefix).items()
        }
        self._source: _Source = _UserPool(pool) if pool is not None else _NoSource()
        self._connect_listener: Callable[[], Awaitable[_Connection]] = self._listener_from_pool(
            pool
        )
        self._release_listener: Callable[[_Connection], Awaitable[None]] = self._give_back(pool)
        self._listener: _Listener | None = None
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
    ) -> PostgresState:
        """Build a state with its own connections from a ``postgresql://`` or ``postgres://`` URL.

        The URL is handed to asyncpg as a DSN (user, password, host, port, database and query
        options such as ``sslmode``). The state opens at most ``max_connections`` connections for
        statements, plus one listener connection once a key is watched, each within
        ``connect_timeout`` seconds. A burst of operations larger than the pool waits for a free
        connection (within ``op_timeout``) instead of failing.
        """
        parsed = StateURL(url)
        if parsed.scheme not in ("postgresql", "postgres"):
            raise ValueError(f"not a PostgreSQL URL: {redact(url)!r}")
        connect = check_seconds(connect_timeout, "connect_timeout")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")

        async def open_connection() -> _Connection:
            conn: _Connection = await asyncpg.connect(
                dsn=url,
                timeout=connect,
                server_settings={"application_name": "asynclock", "synchronous_commit": "off"},
            )
            return conn

        state = cls(
            None,
            prefix=prefix,
            table_prefix=table_prefix,
            op_timeout=op_timeout,
            create_schema=create_schema,
            token_retention=token_retention,
            reservation=reservation,
            purge_interval=purge_interval,
        )
        state._source = ConnectionPool(open_connection, _terminate, _close, max_connections)
        state._connect_listener = open_connection
        state._release_listener = _close
        state._where = f"PostgreSQL at {redact(url)}"
        return state

    def __repr__(self) -> str:
        where = self._where.removeprefix("PostgreSQL at ")
        return f"PostgresState({where}, prefix={self._prefix!r})"

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
        """Stop the listener and the background purge; close connections this state opened."""
        self._closed = True
        purge, self._purge_task = self._purge_task, None
        if purge is not None:
            purge.cancel()
            await asyncio.wait((purge,))
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.aclose()
        await self._source.aclose()
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

    def _unavailable(self, exc: BaseException) -> StateUnavailableError:
        return unavailable_error(exc, self._where, self._op_timeout)

    async def _ensure_schema(self) -> None:
        async with self._schema_lock:
            if self._schema_ready:
                return
            statements = load_schema(__package__ or __name__, self._table_prefix)
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
            await self._call(lambda conn: conn.execute(script), idempotent=True)
            self._schema_ready = True

    async def _call(
        self, work: Callable[[_Connection], Coroutine[object, object, object]], *, idempotent: bool
    ) -> object:
        """Run ``work`` on a pooled connection under the operation deadline.

        A reused connection that turns out dead (server restart, idle timeout) is replaced and
        ``work`` retried once, if it is ``idempotent``. A cancelled caller leaves the statement
        to finish in the background (see :func:`asynclock.state._sql.shielded`); a connection
        whose statement failed at the transport level or overran the deadline is discarded.
        """
        source = self._source
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._op_timeout
        try:
            async with deadline_at(deadline):
                retry = idempotent
                while True:
                    conn, reused = await source.checkout()

                    def settle(task: asyncio.Task[object], conn: _Connection = conn) -> None:
                        exc = None if task.cancelled() else task.exception()
                        broken = task.cancelled() or (
                            exc is not None and not _is_statement_error(exc)
                        )
                        source.checkin(conn, broken=broken)

                    try:
                        result = await shielded(
                            work(conn),
                            settle=settle,
                            kill=conn.terminate,
                            deadline=deadline,
                            grace=self._op_timeout,
                        )
                    except asyncio.CancelledError:
                        raise  # settled by shielded()
                    except BaseException as exc:
                        if _is_statement_error(exc):
                            source.checkin(conn, broken=False)  # the server answered: in sync
                            raise
                        source.checkin(conn, broken=True)
                        if retry and reused and isinstance(exc, _UNAVAILABLE):
                            retry = False
                            continue
                        raise
                    source.checkin(conn, broken=False)
                    return result
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc

    async def _fetch(
        self, name: str, params: dict[str, object], *, idempotent: bool
    ) -> list[_Record]:
        if not self._schema_ready:
            await self._ensure_schema()
        sql, names = self._queries[name]
        args = [params[n] for n in names]
        rows = await self._call(lambda conn: conn.fetch(sql, *args), idempotent=idempotent)
        assert isinstance(rows, list)
        return rows

    def _ids(self, key: str) -> tuple[bytes, str]:
        full = self._prefix + key
        return key_id(full), full

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
                if not self._schema_ready:
                    await self._ensure_schema()
                status = await self._call(_executor(self._queries[name], params), idempotent=True)
                deleted = int(str(status).rsplit(" ", 1)[-1])
                total += deleted
                if once or deleted < _PURGE_BATCH:
                    break
        return total

    # -- the State protocol -----------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire` (``acquire`` in ``queries.sql``).

        Atomic against every client of the database; expiry by the server's ``now()``.
        """
        check_key(key)
        ident, full = self._ids(key)
        if waiting:
            # before the statement: if it is cancelled it may still land and flag the key
            self._flagged.add(ident.hex())
        rows = await self._fetch(
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
        token, retry_after = rows[0][0], rows[0][1]
        if isinstance(token, int):
            self._flagged.discard(ident.hex())
            return Grant(token)
        return Grant(None, float(retry_after) if isinstance(retry_after, float) else 0.0)

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release` (``release`` in ``queries.sql``).

        Atomic compare-and-release (or handoff to ``successor``); a release NOTIFYs watchers in
        the same transaction.
        """
        ident, _ = self._ids(key)
        rows = await self._fetch(
            "release",
            {
                "id": ident,
                "owner": owner,
                "successor": successor if successor and ttl else None,
                "successor_mark": mark_of(successor) if successor else None,
                "successor_ttl_ms": ttl_ms(ttl) if successor and ttl else 0,
                "reservation_ms": self._reservation_ms,
                "channel": self._channel,
                "payload": ident.hex(),
            },
            idempotent=False,
        )
        if not rows:
            return Release(owned=False)
        token, handed_over = rows[0][0], rows[0][1]
        if handed_over is True and isinstance(token, int):
            return Release(owned=True, handoff_token=token)
        return Release(owned=True)

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.State.abandon` (``abandon`` in ``queries.sql``).

        Releases the key if ``owner`` holds it, else marks ``owner`` so its acquire, should it
        still arrive, fails; the mark lives ``max(2 * op_timeout, 2)`` seconds. Atomic.
        """
        ident, full = self._ids(key)
        await self._fetch(
            "abandon",
            {
                "id": ident,
                "name": full,
                "owner": owner,
                "mark": mark_of(owner),
                "mark_ttl_ms": self._mark_ttl_ms,
                "reservation_ms": self._reservation_ms,
                "channel": self._channel,
                "payload": ident.hex(),
            },
            idempotent=True,
        )

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.extend`: atomic compare-then-reset of the TTL."""
        ident, _ = self._ids(key)
        rows = await self._fetch(
            "extend",
            {"id": ident, "owner": owner, "ttl_ms": ttl_ms(check_ttl(ttl, key=key))},
            idempotent=True,
        )
        return bool(rows)

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect` (one read, server clock)."""
        ident, _ = self._ids(key)
        rows = await self._fetch("inspect", {"id": ident}, idempotent=True)
        if not rows:
            return None
        owner, remaining, token = rows[0][0], rows[0][1], rows[0][2]
        assert isinstance(owner, str)
        assert isinstance(token, int)
        return LockInfo(
            key, owner, float(remaining) if isinstance(remaining, float) else 0.0, token
        )

    async def dedupe_add(self, key: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.dedupe_add`: atomic insert-if-absent, server clock."""
        check_key(key)
        ident, full = self._ids(key)
        rows = await self._fetch(
            "dedupe_add",
            {"id": ident, "name": full, "ttl_ms": ttl_ms(check_ttl(ttl, key=key))},
            idempotent=False,
        )
        self._maybe_purge()
        return bool(rows)

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget` (one DELETE)."""
        ident, _ = self._ids(key)
        rows = await self._fetch("dedupe_forget", {"id": ident}, idempotent=False)
        return bool(rows) and rows[0][0] is True

    @contextlib.asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[EventWatch]:
        """See :meth:`asynclock.state.State.watch`: LISTEN on the state's listener connection.

        The listener is connected and LISTENing before this returns, so a release committed
        afterwards is heard. If the listener's connection drops, every watcher is woken (it
        re-checks the key) and the listener reconnects in the background.
        """
        if self._listener is None:
            self._listener = _Listener(self)
        listener = self._listener
        ident, _ = self._ids(key)
        watch = EventWatch(asyncio.get_running_loop())
        try:
            async with deadline_after(self._op_timeout):
                await listener.ensure()
        except _UNAVAILABLE_OR_TIMEOUT as exc:
            raise self._unavailable(exc) from exc
        payload = ident.hex()
        listener.add(payload, watch)
        try:
            yield watch
        finally:
            if listener.discard(payload, watch) and payload in self._flagged:
                # the last local waiter left without the lock: give the turn back
                self._flagged.discard(payload)
                await _quietly(self._fetch("unflag", self._unflag_params(ident), idempotent=True))

    def _unflag_params(self, ident: bytes) -> dict[str, object]:
        return {
            "id": ident,
            "waiter": self._process,
            "channel": self._channel,
            "payload": ident.hex(),
        }

    async def purge_expired(self) -> int:
        """Delete expired dedupe records and lock rows free for over ``token_retention`` seconds.

        Runs in batches (each one short statement) until nothing is left; returns the number of
        rows deleted. A purged key's next token still exceeds its old ones (the clock seed).
        """
        return await self._purge_batches(once=False)


class _NoSource:
    async def checkout(self) -> tuple[_Connection, bool]:
        raise RuntimeError("PostgresState needs an asyncpg pool, or use PostgresState.from_url()")

    def checkin(self, conn: _Connection | None, *, broken: bool) -> None:
        pass

    async def aclose(self) -> None:
        pass


class _Listener:
    """One LISTENing connection per state; wakes the watchers of the key a NOTIFY names."""

    def __init__(self, state: PostgresState) -> None:
        self._state = state
        self._conn: _Connection | None = None
        self._connecting = asyncio.Lock()
        self._watches: dict[str, set[EventWatch]] = {}
        self._reconnect: asyncio.Task[None] | None = None
        self._closed = False

    async def ensure(self) -> None:
        """Connected and LISTENing (the subscription is active when this returns)."""
        if self._conn is not None:
            return
        async with self._connecting:
            if self._conn is not None or self._closed:
                return
            conn = await self._state._connect_listener()
            try:
                conn.add_termination_listener(self._on_terminated)
                await conn.add_listener(self._state._channel, self._on_notify)
            except BaseException:
                conn.terminate()
                raise
            self._conn = conn

    def add(self, payload: str, watch: EventWatch) -> None:
        self._watches.setdefault(payload, set()).add(watch)

    def discard(self, payload: str, watch: EventWatch) -> bool:
        """Forget ``watch``; ``True`` when it was the key's last one."""
        watches = self._watches.get(payload)
        if watches is not None:
            watches.discard(watch)
            if watches:
                return False
            del self._watches[payload]
        return True

    def _on_notify(self, conn: object, pid: object, channel: object, payload: object) -> None:
        for watch in tuple(self._watches.get(str(payload), ())):
            watch.fire()

    def _on_terminated(self, conn: object) -> None:
        if conn is not self._conn or self._closed:
            return
        self._conn = None
        # A release may have gone unheard: let every watcher re-check now, and listen again.
        self._wake_all()
        if self._reconnect is None:
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    def _wake_all(self) -> None:
        for watches in tuple(self._watches.values()):
            for watch in tuple(watches):
                watch.fire()

    async def _reconnect_loop(self) -> None:
        delay = _FIRST_RECONNECT_DELAY
        try:
            while not self._closed and self._watches and self._conn is None:
                try:
                    async with deadline_after(self._state._op_timeout):
                        await self.ensure()
                except Exception as exc:  # noqa: BLE001, PERF203 - retried with back-off
                    logger.debug("asynclock: PostgreSQL listener reconnect failed: %r", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _MAX_RECONNECT_DELAY)
                else:
                    self._wake_all()  # releases during the gap were not heard
        finally:
            self._reconnect = None

    async def aclose(self) -> None:
        self._closed = True
        task, self._reconnect = self._reconnect, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))
        conn, self._conn = self._conn, None
        self._wake_all()
        if conn is not None:
            try:
                async with deadline_after(1.0):
                    await self._state._release_listener(conn)
            except Exception:  # noqa: BLE001 - closing anyway
                conn.terminate()


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


def _executor(
    query: tuple[str, tuple[str, ...]], params: dict[str, object]
) -> Callable[[_Connection], Coroutine[object, object, object]]:
    """``work`` for :meth:`PostgresState._call` that executes ``query`` (no rows wanted)."""
    sql, names = query
    args = [params[n] for n in names]

    async def execute(conn: _Connection) -> object:
        return await conn.execute(sql, *args)

    return execute


def _is_statement_error(exc: BaseException) -> bool:
    """A server error about the statement itself: the connection stays in sync and usable."""
    return isinstance(exc, _STATEMENT_ERROR) and not isinstance(exc, _UNAVAILABLE)


def _terminate(conn: _Connection) -> None:
    conn.terminate()


async def _close(conn: _Connection) -> None:
    try:
        await conn.close(timeout=1.0)
    except Exception:  # noqa: BLE001 - the socket goes anyway
        conn.terminate()
