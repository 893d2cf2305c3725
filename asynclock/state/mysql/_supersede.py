"""Supersede signals on MySQL: the state's supersede ear, a session that waits on the anchor.

As for the inbox's hand-out (``_ear.py``), MySQL has no NOTIFY, but a session may kill the
running query of another session of its own user (``KILL QUERY``), and a wait killed returns
at once: the ear waits in ``GET_LOCK`` of the name the state's :class:`~._ear.Anchor` holds
(why not ``SLEEP``: ``_ear.py``). A state that listens for a key's supersede signals keeps one
connection of its own (the ear) in the ``supersede_ear`` statement and names that connection in
one row of ``supersede_ears`` per key it listens on; ``supersede_v1`` (``schema.sql``) marks the
signalled token in those rows and kills each ear's query.

Invariants:

* A signal is never lost between two waits: the ear's statement first looks for an unread
  signal of its own and answers at once if there is one, so a kill that came while no statement
  ran (it kills nothing) is made up for by the next statement.
* The ear reads its signals (and marks each read, only that token) on its own connection, then
  hands each ``(key id in hex, token)`` to the state.
* An ear that fails is closed and reopened after a pause; its new connection id is what the
  rows written from then on name (:attr:`SupersedeEar.conn`). A subscription made before is
  not heard meanwhile: its sender's next signal (every slice of its wait) does not reach it
  either, and the key frees when the holder's call ends, as without the signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from asynclock._compat import deadline_after
from asynclock.state.mysql._ear import ANCHOR_LOST

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping

    from asynclock.state.mysql._ear import Anchor
    from asynclock.state.mysql._wake import DedicatedConnection

__all__ = ["SupersedeEar"]

logger = logging.getLogger("asynclock")

#: seconds the ear's wait lasts
EAR_WAIT = 5
#: seconds before a failed ear connection is opened again
RECONNECT_DELAY = 1.0
#: "Query execution was interrupted": what a statement killed outside its wait answers
_INTERRUPTED = 1317


class SupersedeEar:
    """One state's supersede ear (see the module): :meth:`start`, then :meth:`aclose`."""

    __slots__ = ("_anchor", "_connect", "_deliver", "_op_timeout", "_statements", "_task", "conn")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        statements: Mapping[str, str],
        deliver: Callable[[str, int], None],
        *,
        anchor: Anchor,
        op_timeout: float,
    ) -> None:
        """``statements``: ``supersede_ear``, ``supersede_heard``, ``supersede_read`` of
        ``queries.sql``; ``deliver(hex_id, token)``: a signal heard; ``anchor``: the state's."""
        self._anchor = anchor
        self._connect = connect
        self._statements = statements
        self._deliver = deliver
        self._op_timeout = op_timeout
        self._task: asyncio.Task[None] | None = None
        #: the ear connection's CONNECTION_ID(), as the rows name it
        self.conn = 0

    async def start(self) -> None:
        """Open the ear (its id known when this returns) and start listening."""
        conn = await self._open()
        self._task = asyncio.ensure_future(self._listen(conn))
        self._task.set_name("asynclock supersede ear")

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _open(self) -> DedicatedConnection:
        async with deadline_after(self._op_timeout):
            conn = await self._connect()
            try:
                rows = await _query(conn, "SELECT CONNECTION_ID()", None)
            except BaseException:
                conn.close()
                raise
        self.conn = int(str(rows[0][0]))
        return conn

    async def _read(self, conn: DedicatedConnection) -> None:
        """Hand the unread signals of this ear to the state, marking each read."""
        args = {"conn": self.conn}
        async with deadline_after(self._op_timeout):
            rows = await _query(conn, self._statements["supersede_heard"], args)
            for hex_id, token in rows:
                read = {"id": str(hex_id), "conn": self.conn, "token": int(str(token))}
                await _query(conn, self._statements["supersede_read"], read)
        for hex_id, token in rows:
            self._deliver(str(hex_id).lower(), int(str(token)))

    async def _listen(self, conn: DedicatedConnection | None) -> None:
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._open()
                    await self._read(conn)
                    await self._anchor.hold()
                    async with deadline_after(EAR_WAIT + self._op_timeout):
                        args = {"wait": EAR_WAIT, "anchor": self._anchor.name}
                        rows = await _query(conn, self._statements["supersede_ear"], args)
                    if rows and rows[0][-1] == ANCHOR_LOST:
                        self._anchor.lost()
                except asyncio.CancelledError:  # noqa: PERF203 - one wait per round
                    raise
                except Exception as exc:  # noqa: BLE001 - an ear that fails is reopened
                    if _code(exc) != _INTERRUPTED:
                        logger.debug("asynclock: MySQL supersede ear failed: %r", exc)
                        if conn is not None:
                            conn.close()
                        conn = None
                        await asyncio.sleep(RECONNECT_DELAY)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()


async def _query(
    conn: DedicatedConnection, statement: str, args: Mapping[str, object] | None
) -> list[tuple[object, ...]]:
    cursor = await conn.cursor()
    try:
        await cursor.execute(statement, args)
        return [tuple(row) for row in await cursor.fetchall()]
    finally:
        await cursor.close()


def _code(exc: BaseException) -> int:
    """The MySQL error code of a driver exception (0 if none)."""
    code = exc.args[0] if exc.args else 0
    return code if isinstance(code, int) else 0
