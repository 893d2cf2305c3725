"""Cross-process push on MySQL through an *ear*: a session that waits in a marked ``SLEEP``.

MySQL has no NOTIFY; but a session may kill the running query of another session of its own user
(``KILL QUERY``), and a ``SLEEP`` killed returns at once. So a process that waits for something
keeps one connection of its own (the ear) in a statement that first looks whether what it waits
for is there already and else sleeps, and registers that connection's id where the writers find
it; a writer that makes it ready interrupts the ear (a procedure's ``KILL QUERY``, after checking
in ``information_schema.PROCESSLIST`` that the connection runs the ear's marked statement).

:class:`Ear` is that connection and its loop, the same for every user; what an ear waits for and
what its owner does once it is interrupted is an :class:`EarListener`. Two use it:

* the inbox hand-out (:class:`InboxEar`): each serving worker's ear waits for a key written into
  its row (``inbox_ear``); an accept that finds its key free writes the key into the row of one
  live worker and kills its ear (``inbox_wake_one_v2``), which then claims that key first;
* the semaphore waiters of a :class:`~asynclock.MySQLState` (``_semaphore_ear.py``): one ear per
  state, which a release kills when it makes one of the state's waiters eligible.

Invariants:

* A wake-up is never lost between two waits: the ear's statement first looks for what it waits
  for and answers at once if it is there, so a kill that came while no statement ran (it kills
  nothing) is made up for by the next statement.
* The listener hears every answer (a kill, the thing found, or the whole wait passed) before the
  ear waits again, and may run statements of its own on the ear's connection meanwhile.
* An interrupted statement keeps the connection (only its query was killed); a connection that
  fails (or a listener that raises) is closed and reopened after a pause, the listener told
  that wake-ups may have been lost, and the new id is what it registers next.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Protocol

from asynclock._compat import deadline_after, wait_set
from asynclock.state.sql._handout import HintWatch

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping, Sequence

    from asynclock.state.mysql._wake import DedicatedConnection

__all__ = ["EAR_WAIT", "Ear", "EarListener", "InboxEar"]

logger = logging.getLogger("asynclock")

#: seconds the ear's SLEEP lasts (whole seconds: MySQL 8 takes no fraction); an idle ear costs
#: one statement per this
EAR_WAIT = 5
#: seconds before a failed ear connection is opened again
RECONNECT_DELAY = 1.0
#: "Query execution was interrupted": what a killed SLEEP inside a larger statement answers
INTERRUPTED = 1317


class EarListener(Protocol):
    """What an :class:`Ear` tells its owner."""

    def opened(self, channel: str) -> None:
        """A new ear connection, whose ``CONNECTION_ID()`` is ``channel``: what to register."""

    def lost(self) -> None:
        """Wake-ups may have been missed: the ear failed, or was reopened under a new id."""

    async def heard(self, conn: DedicatedConnection, answer: Sequence[object] | None) -> None:
        """The ear's statement ended: ``None`` when interrupted (a kill), else its first row.

        Runs before the ear waits again, and may run statements on ``conn``; an exception
        drops the connection (then :meth:`lost`).
        """


class Ear:
    """One connection of its own waiting in ``statement`` (see the module): :meth:`start`,
    then :meth:`aclose`. ``channel`` is its connection id, ``None`` while it is down."""

    __slots__ = (
        "_args",
        "_channel",
        "_connect",
        "_listener",
        "_op_timeout",
        "_role",
        "_statement",
        "_task",
    )

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        statement: str,
        args: Mapping[str, object],
        listener: EarListener,
        *,
        op_timeout: float,
        role: str,
    ) -> None:
        """``statement`` sleeps ``%(wait)s`` seconds unless what it waits for is there; ``args``
        are its other parameters; ``role`` names the ear in logs and in its task's name."""
        self._connect = connect
        self._statement = statement
        self._args = {**args, "wait": EAR_WAIT}
        self._listener = listener
        self._op_timeout = op_timeout
        self._role = role
        self._channel: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def channel(self) -> str | None:
        """The connection id of the ear, ``None`` while it is down (or closed)."""
        return self._channel

    async def start(self) -> None:
        """Open the ear (its id told to the listener before this returns) and start waiting."""
        conn = await self._open()
        self._task = asyncio.ensure_future(self._listen(conn))
        self._task.set_name(f"asynclock {self._role} ear")

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        task, self._task = self._task, None
        self._channel = None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _open(self) -> DedicatedConnection:
        """A new ear connection, its id told to the listener."""
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
        self._channel = str(rows[0][0])
        self._listener.opened(self._channel)
        return conn

    async def _listen(self, conn: DedicatedConnection | None) -> None:
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._open()
                        self._listener.lost()  # wake-ups may have gone to the old connection
                    answer: Sequence[object] | None = None
                    try:
                        async with deadline_after(EAR_WAIT + self._op_timeout):
                            cursor = await conn.cursor()
                            try:
                                await cursor.execute(self._statement, self._args)
                                answer = (await cursor.fetchall())[0]
                            finally:
                                await cursor.close()
                    except asyncio.CancelledError:
                        raise
                    except Exception as exc:
                        if error_code(exc) != INTERRUPTED:
                            raise
                    await self._listener.heard(conn, answer)
                except asyncio.CancelledError:  # noqa: PERF203 - one try per wait, not per row
                    raise
                except Exception as exc:  # noqa: BLE001 - an ear that fails is reopened
                    logger.debug("asynclock: MySQL %s ear failed: %r", self._role, exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    self._channel = None
                    self._listener.lost()
                    await asyncio.sleep(RECONNECT_DELAY)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()


class InboxEar:
    """One inbox worker's ear: :meth:`start`, then its watch, then :meth:`aclose`.

    The listener of its :class:`Ear`: every answer wakes the worker (a kill, work found, or the
    whole wait passed: the worker then claims once, which also makes up for a wake-up that
    reached a dead ear), and the ear waits again only once the worker's claims are done: its
    first look would otherwise see the very key the worker is about to claim, and wake it a
    second time for nothing.
    """

    __slots__ = ("_ear", "_watch")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        statement: str,
        *,
        worker: str,
        op_timeout: float,
    ) -> None:
        """``statement``: ``inbox_ear`` of ``queries.sql``; ``worker``: the id of the worker's row
        (its hint is what the ear looks for)."""
        self._watch = HintWatch()
        self._ear = Ear(
            connect, statement, {"worker": worker}, self, op_timeout=op_timeout, role="inbox"
        )

    async def start(self) -> HintWatch:
        """Open the ear and start listening; the watch the wake-ups arrive at."""
        await self._ear.start()  # the worker registers the ear's id: known before we return
        return self._watch

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        await self._ear.aclose()

    def opened(self, channel: str) -> None:
        """See :meth:`EarListener.opened`: the id the worker's row names."""
        self._watch.channel = channel

    def lost(self) -> None:
        """See :meth:`EarListener.lost`: the worker claims once."""
        self._watch.wake()

    async def heard(self, conn: DedicatedConnection, answer: Sequence[object] | None) -> None:
        """See :meth:`EarListener.heard`: wake the worker, then wait until its claims are done."""
        self._watch.wake()
        # bounded: a worker that never claims again (stopping) must not freeze the ear
        await wait_set(self._watch.idle, EAR_WAIT)


def error_code(exc: BaseException) -> int:
    """The MySQL error code of a driver exception (0 if none)."""
    code = exc.args[0] if exc.args else 0
    return code if isinstance(code, int) else 0
