"""What PostgresState and MySQLState share: everything but the driver (an internal base class).

The base class owns the operations of the State protocol (parameters in, answers out), the
operation deadline and the error mapping, the retries, the schema bootstrap, the purge loop,
the watch registry and the lifecycle; every statement runs through
:meth:`asynclock.state._pool.ConnectionSource.exchange`. A backend supplies the driver-specific
parts as the small hooks of :class:`asynclock.state.sql._driver.SQLDriver`; the options and
their checks are in ``_options.py``.

This is an implementation detail shared by two backends, not part of the contract: a
third-party state needs only the :class:`asynclock.state.State` protocol.

The inbox's operations live in ``_inbox.py``.

Size: just over 500 lines: one method per State operation, each a few lines around one
statement, plus the retries and the purge loop they share; the other capabilities are modules
of their own (``_inbox.py``, ``_handout.py``, ``_semaphore.py``), and splitting the State
operations themselves would separate a lock's acquire from its release.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, TypeVar

from asynclock._owner import new_process_id
from asynclock._validate import check_key, check_seconds, check_ttl, ttl_ms
from asynclock.state._base import ClosesOnExit
from asynclock.state._guard import OperationGuard
from asynclock.state._protocol import LockInfo
from asynclock.state._watch import registered
from asynclock.state.sql._driver import SQLDriver
from asynclock.state.sql._options import DEFAULT_OP_TIMEOUT
from asynclock.state.sql._queries import (
    check_table_prefix,
    glob_to_like,
    key_id,
    like_escape,
    load_queries,
    load_schema,
    mark_of,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping, Sequence

    from asynclock.state._pool import ConnectionSource
    from asynclock.state._protocol import Grant, Release
    from asynclock.state.sql._driver import WakeableWatch
    from asynclock.state.sql._handout import HintWatch

__all__ = ["SQLState"]

logger = logging.getLogger("asynclock")

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")

#: rows one purge statement deletes at most
PURGE_BATCH = 500
#: how often a statement the server rolled back whole (deadlock victim, ...) runs again
_ROLLED_BACK_RETRIES = 5


class SQLState(ClosesOnExit, SQLDriver[C, S, R]):
    """Locks and dedupe records in SQL tables: the driver-independent part of a SQL state.

    ``C`` is the driver's connection, ``S`` a prepared statement, ``R`` the raw answer of one
    statement. Every operation runs one named statement of the backend's ``queries.sql``, in
    autocommit mode (one transaction), on a connection of :attr:`_source`:

    * under one deadline of ``op_timeout`` seconds, connection wait included; a timeout or a
      driver error that means "unreachable" raises :class:`~asynclock.StateUnavailableError`
      chained to the driver's error;
    * a connection whose statement did not finish cleanly (cancelled, timed out, lost) is
      discarded, never reused: the statement may still be running, and a half-read reply or an
      open transaction would reach the next user. Its outcome is unknown; the lock layer undoes
      an unknown acquire through :meth:`abandon`;
    * a server error about the statement (the connection stays in sync) gives the connection
      back; one the server rolled back whole (a deadlock victim) runs again;
    * a reused connection found dead (server restart, idle timeout) is replaced, and an
      idempotent statement retried once.

    Args:
        source: where connections come from.
        where: how ``repr`` and error messages name the server (never with a password).
        prefix: put in front of every key, so applications sharing the tables never meet.
        table_prefix: put in front of the table names (a plain identifier).
        op_timeout: seconds one operation may take, connection wait included.
        create_schema: run ``schema.sql`` (idempotent) before the first operation; set it to
            ``False`` when migrations own the schema.
        token_retention: seconds a released key's row is kept before :meth:`purge_expired` may
            delete it.
        reservation: seconds a release keeps the lock reserved for a waiting state (another
            process) that flagged it, before anyone may take it.
        purge_interval: seconds between opportunistic background purges of expired rows (each
            deletes every row expired by then, in batches of 500 rows per statement);
            ``None`` turns them off.
    """

    def __init__(
        self,
        source: ConnectionSource[C],
        *,
        where: str,
        prefix: str = "asynclock:",
        table_prefix: str = "asynclock_",
        op_timeout: float = DEFAULT_OP_TIMEOUT,
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
        self._schema_ready = not create_schema
        self._schema_lock = asyncio.Lock()
        self._source = source
        self._guard = OperationGuard(where, op, self._UNAVAILABLE)
        self._process = new_process_id()
        self._channel = f"{self._table_prefix}released"
        self._statements: dict[str, S] = {
            name: self._prepare(query)
            for name, query in load_queries(self._PACKAGE, self._table_prefix).items()
        }
        #: the watches of each key (by the key's id in hex)
        self._watches: dict[str, set[WakeableWatch]] = {}
        #: the hand-out's wake-ups of this state's serving workers, by the channel each hears on
        self._worker_watches: dict[str, HintWatch] = {}
        self._next_purge = 0.0
        self._purge_task: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        where = self._where.removeprefix(f"{self._BACKEND} at ")
        return f"{type(self).__name__}({where}, prefix={self._prefix!r})"

    async def aclose(self) -> None:
        """Stop the background purge and listening, wake every watcher, close the connections.

        A state given a pool closes none of the pool's connections.
        """
        self._closed = True
        purge, self._purge_task = self._purge_task, None
        if purge is not None:
            purge.cancel()
            await asyncio.wait((purge,))
        await self._stop_listening()
        self._wake_all()
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

    def _released_here(self, ident: str) -> None:
        """This state freed key ``ident``: wake its local watchers (unless the server does)."""
        self._wake(ident)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        """The server's name in errors and ``repr`` (a redacted URL)."""
        return self._guard.where

    def _ids(self, key: str) -> tuple[bytes, str]:
        """The key's id (SHA-256 of the prefixed key) and the prefixed key."""
        full = self._prefix + key
        return key_id(full), full

    async def _ensure_schema(self) -> None:
        async with self._schema_lock:
            if self._schema_ready:
                return
            for statement in self._schema(load_schema(self._PACKAGE, self._table_prefix)):
                await self._call(statement, {}, idempotent=True)
            self._schema_ready = True

    async def _run(self, name: str, params: Mapping[str, object], *, idempotent: bool) -> R:
        if not self._schema_ready:
            await self._ensure_schema()
        return await self._call(self._statements[name], params, idempotent=idempotent)

    async def _call(self, statement: S, params: Mapping[str, object], *, idempotent: bool) -> R:
        """Run one statement on a pooled connection under the operation deadline.

        The statement is awaited in the caller's task: no helper task, no shield. If the caller
        is cancelled (or the deadline passes) while it runs, the connection is discarded at once
        (the driver then sends nothing more on it) and the cancellation goes on.
        """
        stale = self._stale if idempotent else self._never_sent
        async with self._guard():
            rolled_back = 0
            while True:
                try:
                    return await self._source.exchange(
                        self._is_statement_error, stale, self._execute, statement, params
                    )
                except Exception as exc:  # noqa: PERF203 - Python 3.11: a try costs nothing
                    # a deadlock victim: the server undid it whole, so it may simply run again
                    if (
                        rolled_back == _ROLLED_BACK_RETRIES
                        or not self._is_statement_error(exc)
                        or not self._rolled_back_whole(exc)
                    ):
                        raise
                    rolled_back += 1

    def _stale(self, exc: BaseException) -> bool:
        """On a reused connection: it was dead already, and the statement is safe to repeat."""
        return self._never_sent(exc) or isinstance(exc, self._UNAVAILABLE)

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
            # every expired row, in batches: one batch per interval fell behind any steady
            # traffic of more than PURGE_BATCH new records per interval (#30), and the table grew
            await self._purge_batches()
        except Exception as exc:  # noqa: BLE001 - opportunistic: the next one will try again
            logger.debug("asynclock: background purge of expired rows failed: %r", exc)
        finally:
            self._purge_task = None

    def _purge_jobs(self) -> tuple[tuple[str, dict[str, object]], ...]:
        """The purge statements (``queries.sql`` names) and their parameters; a capability of
        the state with tables of its own (semaphores) adds its statement."""
        return (
            ("purge_locks", {"retention_ms": self._retention_ms, "batch": PURGE_BATCH}),
            ("purge_dedupe", {"batch": PURGE_BATCH}),
            ("purge_supersede_carried", {"batch": PURGE_BATCH}),
        )

    async def _purge_batches(self) -> int:
        total = 0
        for name, params in self._purge_jobs():
            while True:
                deleted = self._deleted(await self._run(name, params, idempotent=True))
                total += deleted
                if deleted < PURGE_BATCH:
                    break
        return total

    def _wake(self, ident: str) -> None:
        for watch in tuple(self._watches.get(ident, ())):
            watch.fire()

    def _wake_all(self) -> None:
        for watches in self._watches.values():
            for watch in tuple(watches):
                watch.fire()
        for worker in tuple(self._worker_watches.values()):
            worker.wake()

    # -- the State protocol -----------------------------------------------------------------

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """See :meth:`asynclock.state.State.acquire` (``acquire`` in ``queries.sql``).

        Atomic against every client of the database; expiry by the server's clock. A failed
        ``waiting`` attempt flags the key for this state: the holder's state then gives way to
        it at release (see ``reservation``).
        """
        answer = await self._run(
            "acquire", self._acquire_params(key, owner, ttl, waiting=waiting), idempotent=True
        )
        self._maybe_purge()
        return self._grant(answer)

    def _acquire_params(
        self, key: str, owner: str, ttl: float, *, waiting: bool = False
    ) -> dict[str, object]:
        check_key(key)
        ident, full = self._ids(key)
        return {
            "id": self._id_param(ident),
            "name": full,
            "owner": owner,
            "mark": mark_of(owner),
            "ttl_ms": ttl_ms(check_ttl(ttl, key=key)),
            "waiter": self._process if waiting else None,
            **self._NO_CLAIM,
        }

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """See :meth:`asynclock.state.State.release` (``release`` in ``queries.sql``).

        Atomic compare-and-release, or handoff to ``successor``; a release wakes the watchers.
        """
        return await self._release_with(key, owner, successor, ttl, self._NO_CLAIM)

    async def _release_with(
        self,
        key: str,
        owner: str,
        successor: str | None,
        ttl: float | None,
        claim: Mapping[str, object],
    ) -> Release:
        ident, _ = self._ids(key)
        answer = self._release(
            await self._run(
                "release",
                {**self._release_params(ident, owner, successor, ttl), **claim},
                idempotent=False,
            )
        )
        if answer.owned and answer.handoff_token is None:
            self._released_here(ident.hex())
        return answer

    def _release_params(
        self, ident: bytes, owner: str, successor: str | None, ttl: float | None
    ) -> dict[str, object]:
        """The parameters of the ``release`` statement."""
        handoff = bool(successor and ttl)
        return {
            "id": self._id_param(ident),
            "owner": owner,
            "successor": successor if handoff else None,
            "successor_mark": mark_of(successor) if successor and handoff else None,
            "successor_ttl_ms": ttl_ms(ttl) if ttl and handoff else 0,
            "reservation_ms": self._reservation_ms,
            "channel": self._channel,
            "payload": ident.hex(),
        }

    async def abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.State.abandon` (``abandon`` in ``queries.sql``).

        Releases the key if ``owner`` holds it, else marks ``owner`` so its acquire, should it
        still arrive, fails (the mark lives ``max(2 * op_timeout, 2)`` seconds); either way
        withdraws this state's waiting flag, and frees the key at once if it was reserved for
        this state. One atomic statement.
        """
        ident, full = self._ids(key)
        hex_id = ident.hex()
        answer = await self._run(
            "abandon",
            {
                "id": self._id_param(ident),
                "name": full,
                "owner": owner,
                "mark": mark_of(owner),
                "mark_ttl_ms": self._mark_ttl_ms,
                "reservation_ms": self._reservation_ms,
                "waiter": self._process,
                "channel": self._channel,
                "payload": hex_id,
            },
            idempotent=True,
        )
        if self._freed(answer):
            self._released_here(hex_id)

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.extend`: atomic compare-then-reset of the TTL."""
        ident, _ = self._ids(key)
        answer = await self._run(
            "extend",
            {
                "id": self._id_param(ident),
                "owner": owner,
                "ttl_ms": ttl_ms(check_ttl(ttl, key=key)),
            },
            idempotent=True,
        )
        return self._matched(answer)

    async def inspect(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.State.inspect` (one read, server clock)."""
        ident, _ = self._ids(key)
        answer = await self._run("inspect", {"id": self._id_param(ident)}, idempotent=True)
        return self._lock_info(key, answer)

    async def held_locks(self, match: str = "*") -> AsyncIterator[LockInfo]:
        """See :meth:`asynclock.state.LockAdmin.held_locks` (one read of the lock table).

        ``match`` is a glob of ``*`` and ``?`` (SQL ``LIKE`` has no character classes, so ``[``
        is refused with ``ValueError``).
        """
        pattern = like_escape(self._prefix) + glob_to_like(match)
        answer = await self._run("held_locks", {"pattern": pattern}, idempotent=True)
        start = len(self._prefix)
        for name, owner, remaining, token in self._held(answer):
            yield LockInfo(name[start:], owner, remaining, token)

    async def force_release(self, key: str) -> LockInfo | None:
        """See :meth:`asynclock.state.LockAdmin.force_release`.

        Releases in the holder's name (the ``release`` statement, compare-and-release), so a
        holder that changed between the read and the release is never freed by mistake; tried
        again then, a few times.
        """
        for _ in range(3):
            holder = await self.inspect(key)
            if holder is None:
                return None
            if (await self.release(key, holder.owner)).owned:
                return holder
        return None

    async def dedupe_add(self, key: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.State.dedupe_add`: atomic insert-if-absent, server clock."""
        check_key(key)
        ident, full = self._ids(key)
        answer = await self._run(
            "dedupe_add",
            {"id": self._id_param(ident), "name": full, "ttl_ms": ttl_ms(check_ttl(ttl, key=key))},
            idempotent=False,
        )
        self._maybe_purge()
        return self._claimed(answer)

    async def dedupe_keep(self, key: str, ttl: float) -> None:
        """See :meth:`asynclock.state.State.dedupe_keep` (one upsert, server clock)."""
        check_key(key)
        ident, full = self._ids(key)
        await self._run(
            "dedupe_keep",
            {"id": self._id_param(ident), "name": full, "ttl_ms": ttl_ms(check_ttl(ttl, key=key))},
            idempotent=True,
        )

    async def dedupe_forget(self, key: str) -> bool:
        """See :meth:`asynclock.state.State.dedupe_forget` (one DELETE of a live record)."""
        ident, _ = self._ids(key)
        answer = await self._run("dedupe_forget", {"id": self._id_param(ident)}, idempotent=False)
        return self._matched(answer)

    async def dedupe_remaining(self, key: str) -> float | None:
        """See :meth:`asynclock.state.DedupeReading.dedupe_remaining` (one read, server clock)."""
        ident, _ = self._ids(key)
        answer = await self._run("dedupe_remaining", {"id": self._id_param(ident)}, idempotent=True)
        return self._remaining(answer)

    async def supersede_carry(self, key: str, events: Sequence[str], ttl: float) -> None:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_carry` (one statement: a row
        per key holding a JSON array, appended to)."""
        check_key(key)
        expiry = ttl_ms(check_ttl(ttl))
        if not events:
            return
        ident, _ = self._ids(key)
        params = {"id": self._id_param(ident), "events": json.dumps(list(events)), "ttl_ms": expiry}
        # not idempotent: run twice, the events would be carried twice
        await self._run("supersede_carry", params, idempotent=False)

    async def supersede_collect(self, key: str) -> list[str]:
        """See :meth:`asynclock.state.SupersedeSignals.supersede_collect` (one statement, or
        one procedure call on MySQL: the row read and deleted)."""
        check_key(key)
        ident, _ = self._ids(key)
        answer = await self._run(
            "supersede_collect", {"id": self._id_param(ident)}, idempotent=False
        )
        events: list[str] = []
        for row in self._rows(answer):
            if row and isinstance(row[0], (str, bytes)):
                events.extend(str(item) for item in json.loads(row[0]))
        return events

    @contextlib.asynccontextmanager
    async def watch(self, key: str) -> AsyncIterator[WakeableWatch]:
        """See :meth:`asynclock.state.State.watch`.

        A release through this state, or one heard from the server, wakes the watch; how
        releases of other processes are heard is the backend's (see its module).
        """
        ident, _ = self._ids(key)
        hex_id = ident.hex()
        watch = self._new_key_watch(asyncio.get_running_loop(), hex_id)
        await self._listen()
        with registered(self._watches, hex_id, watch):
            yield watch

    async def purge_expired(self) -> int:
        """Delete expired dedupe records and lock rows free for over ``token_retention`` seconds.

        Runs in batches (each one short statement) until nothing is left; returns the number of
        rows deleted. A purged key's next token still exceeds its old ones (the clock seed).
        """
        return await self._purge_batches()
