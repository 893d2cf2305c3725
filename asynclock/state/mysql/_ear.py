"""The inbox hand-out's wake-up on MySQL: a worker's *ear*, a session that waits in ``SLEEP``.

MySQL has no NOTIFY; but a session may kill the running query of another session of its own user
(``KILL QUERY``), and a ``SLEEP`` killed returns at once. So each serving worker keeps one
connection of its own (the ear) in the ``inbox_ear`` statement, and registers that connection's
id in its row of ``inbox_workers``; an accept that finds its key free kills the ear of one live
worker (``inbox_wake_one_v1``), which then claims a key.

Invariants:

* A wake-up is never lost between two waits: the ear's statement first looks for a free key with
  work and answers at once if there is one, so a kill that came while no statement ran (it kills
  nothing) is made up for by the next statement.
* Every answer of the ear wakes the worker (a kill, work found, or the whole wait passed: the
  worker then claims once, which also makes up for a wake-up that reached a dead ear), and the
  ear waits again only once the worker's claims are done: its first look would otherwise see
  the very key the worker is about to claim, and wake it a second time for nothing.
* An interrupted statement keeps the connection (only its query was killed); a connection that
  fails is closed and reopened after a pause, and its new id is what the worker registers next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from asynclock._compat import deadline_after
from asynclock.state.sql._handout import HintWatch

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from asynclock.state.mysql._wake import DedicatedConnection

__all__ = ["EAR_WAIT", "InboxEar"]

logger = logging.getLogger("asynclock")

#: seconds the ear's SLEEP lasts (whole seconds: MySQL 8 takes no fraction); an idle worker costs
#: one ear statement and one claim per this
EAR_WAIT = 5
#: seconds before a failed ear connection is opened again
RECONNECT_DELAY = 1.0
#: "Query execution was interrupted": what a killed SLEEP inside a larger statement answers
_INTERRUPTED = 1317


class InboxEar:
    """One worker's ear (see the module): :meth:`start`, then its watch, then :meth:`aclose`."""

    __slots__ = ("_connect", "_op_timeout", "_space", "_statement", "_task", "_watch")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        statement: str,
        *,
        space: str,
        op_timeout: float,
    ) -> None:
        """``statement``: ``inbox_ear`` of ``queries.sql``; ``space``: the prefix's id in hex."""
        self._connect = connect
        self._statement = statement
        self._space = space
        self._op_timeout = op_timeout
        self._watch = HintWatch()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> HintWatch:
        """Open the ear and start listening; the watch the wake-ups arrive at."""
        conn = await self._open()  # the worker registers the ear's id: known before we return
        self._task = asyncio.ensure_future(self._listen(conn))
        self._task.set_name("asynclock inbox ear")
        return self._watch

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _open(self) -> DedicatedConnection:
        """A new ear connection, its id in the watch's ``channel``."""
        async with deadline_after(self._op_timeout):
            conn = await self._connect()
            try:
                cursor = await conn.cursor()
                await cursor.execute("SELECT CONNECTION_ID()")
                rows = await cursor.fetchall()
                await cursor.close()
            except BaseException:
                conn.close()
                raise
        self._watch.channel = str(rows[0][0])
        return conn

    async def _listen(self, conn: DedicatedConnection | None) -> None:
        args = {"space": self._space, "wait": EAR_WAIT}
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._open()
                        self._watch.wake()  # wake-ups may have gone to the old connection
                    async with deadline_after(EAR_WAIT + self._op_timeout):
                        cursor = await conn.cursor()
                        try:
                            await cursor.execute(self._statement, args)
                            await cursor.fetchall()
                        finally:
                            await cursor.close()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - an ear that fails is reopened
                    if _code(exc) != _INTERRUPTED:
                        logger.debug("asynclock: MySQL inbox ear failed: %r", exc)
                        if conn is not None:
                            conn.close()
                        conn = None
                        self._watch.wake()
                        await asyncio.sleep(RECONNECT_DELAY)
                        continue
                self._watch.wake()
                # bounded: a worker that never claims again (stopping) must not freeze the ear
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await asyncio.wait_for(self._watch.idle.wait(), EAR_WAIT)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()


def _code(exc: BaseException) -> int:
    """The MySQL error code of a driver exception (0 if none)."""
    code = exc.args[0] if exc.args else 0
    return code if isinstance(code, int) else 0
