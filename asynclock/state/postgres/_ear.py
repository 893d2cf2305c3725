"""The inbox hand-out's wake-up on PostgreSQL without a NOTIFY: a worker's *ear*.

On PostgreSQL up to 18 at least, every commit that NOTIFYs signals every LISTENing session of the
database, whatever its channel, and each reads the notification queue in a transaction of its
own: a NOTIFY per event costs one transaction per worker process (#24). So each serving worker
keeps one session of its own (the ear, on the listener's address: direct to the server, never
through a transaction pooler) waiting in ``inbox_ear`` (a ``pg_sleep``), and its row of
``inbox_workers`` names the ear's backend pid. An accept that finds its key free writes the key
into one live worker's row (its hint) and cancels that ear's sleep (``pg_cancel_backend``, in
``inbox_wake_one_v2``); the worker then claims, reading the hint from its row.

Invariants:

* A wake-up is never lost between two waits. The cancel acts at once, before the accept commits,
  and a cancel that lands while the ear runs no statement is dropped by the server; but the
  waker's hint stays locked until its commit, and both the ear's statement (before it sleeps) and
  the claim lock the worker's row without skipping: they wait for that commit and see the hint.
* Every answer of the ear wakes the worker (a cancel, a hint found, the whole wait passed: the
  worker then claims once, which also makes up for a wake-up that reached no ear), and the ear
  waits again only once the worker's claims are done.
* A wake-up lost for good (the row's ear is dead or not ours, and the NOTIFY fallback reached no
  live worker either) leaves the key free with work: any worker's next claim takes it, at the
  latest the one at the end of its ear's wait (:data:`EAR_WAIT`) or the rescan, every
  ``min(5 s, lock_ttl / 2)``.
* A cancelled statement keeps the connection; a connection that fails is closed and reopened
  after a pause, the worker woken (a wake-up may have gone to the old one), and its new pid is
  what the worker's row names from its next renewal (meanwhile wakers find no ear at the old pid
  and NOTIFY the worker's channel instead: see :class:`~asynclock.state.postgres.PostgresState`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from asyncpg import exceptions as pg_errors  # type: ignore[import-untyped]

from asynclock._compat import deadline_after, wait_set

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock.state.postgres._connection import Connection as _Connection
    from asynclock.state.sql._handout import HintWatch

__all__ = ["EAR_WAIT", "PostgresEar"]

logger = logging.getLogger("asynclock")

#: seconds the ear's sleep lasts; an idle worker costs one ear statement and one claim per this
EAR_WAIT = 5.0
#: seconds before a failed ear connection is opened again
RECONNECT_DELAY = 1.0
#: what ``inbox_ear_v1`` fails with when the worker's row holds a hint (a wake-up is waiting)
_HINTED = "ALE02"


class PostgresEar:
    """One worker's ear (see the module): :meth:`start`, then :attr:`pid`, then :meth:`aclose`."""

    __slots__ = (
        "_close",
        "_connect",
        "_op_timeout",
        "_statement",
        "_task",
        "_watch",
        "_worker",
        "pid",
    )

    def __init__(
        self,
        connect: Callable[[], Awaitable[_Connection]],
        close: Callable[[_Connection], Awaitable[None]],
        statement: str,
        *,
        worker: str,
        watch: HintWatch,
        op_timeout: float,
    ) -> None:
        """``statement``: ``inbox_ear`` of ``queries.sql`` ($1 the worker, $2 the wait)."""
        self._connect = connect
        self._close = close
        self._statement = statement
        self._worker = worker
        self._watch = watch
        self._op_timeout = op_timeout
        self._task: asyncio.Task[None] | None = None
        #: the ear's backend pid (``None`` while it has no connection)
        self.pid: int | None = None

    async def start(self) -> None:
        """Open the ear (its pid known when this returns) and start listening."""
        conn = await self._open()
        self._task = asyncio.ensure_future(self._listen(conn))
        self._task.set_name("asynclock PostgreSQL inbox ear")

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _open(self) -> _Connection:
        async with deadline_after(self._op_timeout):
            conn = await self._connect()
        self.pid = conn.get_server_pid()
        return conn

    async def _until_idle(self) -> None:
        """Until the worker's claims are done (bounded: a worker that never claims again, as
        one stopping, must not freeze the ear)."""
        await wait_set(self._watch.idle, EAR_WAIT)

    async def _listen(self, conn: _Connection | None) -> None:
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._open()
                        self._watch.wake()  # wake-ups may have gone to the old connection
                    async with deadline_after(EAR_WAIT + self._op_timeout):
                        await conn.fetch(self._statement, self._worker, EAR_WAIT)
                except asyncio.CancelledError:
                    raise
                except pg_errors.QueryCanceledError:
                    pass  # a wake-up (or statement_timeout): the worker claims
                except Exception as exc:  # noqa: BLE001 - an ear that fails is reopened
                    # ALE02: a wake-up came while no statement ran (its hint found): no failure
                    if getattr(exc, "sqlstate", None) != _HINTED:
                        logger.debug("asynclock: PostgreSQL inbox ear failed: %r", exc)
                        self.pid = None
                        if conn is not None:
                            conn.terminate()
                        conn = None
                        self._watch.wake()
                        await asyncio.sleep(RECONNECT_DELAY)
                        continue
                self._watch.wake()
                await self._until_idle()
        finally:
            self.pid = None
            if conn is not None:
                try:
                    async with deadline_after(1.0):
                        await self._close(conn)
                except Exception:  # noqa: BLE001 - closing anyway
                    conn.terminate()
