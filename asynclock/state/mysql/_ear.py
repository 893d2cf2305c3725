"""Cross-process push on MySQL through an *ear*: a session that waits in a marked statement.

MySQL has no NOTIFY; but a session may kill the running query of another session of its own user
(``KILL QUERY``), and a wait killed returns at once. So a process that waits for something
keeps one connection of its own (the ear) in a statement that first looks whether what it waits
for is there already and else waits, and registers that connection's id where the writers find
it; a writer that makes it ready interrupts the ear (a procedure's ``KILL QUERY``, after checking
in ``information_schema.PROCESSLIST`` that the connection runs the ear's marked statement).

The wait is ``GET_LOCK`` of a name that the state's :class:`Anchor` (one more connection of its
own) holds, not ``SLEEP``: the server wakes a killed ``SLEEP`` through one mutex that every
sleeping session shares, and while sleepers come and go the killer retries it every 50 ms for up
to 2 s. With a few ears killed at once (an inbox's accepts, a supersede signal) a ``KILL QUERY``
took up to 2 s and a wake-up up to 6 s on MariaDB 10.11; a ``GET_LOCK`` waiter is woken through
a mutex of its own (p99 under 12 ms in the same test, ``docs/decisions.md``).

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
* An ear waits only while its anchor holds the name. An ear whose ``GET_LOCK`` took the name
  (the anchor's connection was gone) gives it back in the same statement and answers
  :data:`ANCHOR_LOST`; the anchor is opened again before any ear of the state waits again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Protocol

from asynclock._compat import deadline_after, wait_set
from asynclock.state.sql._handout import HintWatch

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Mapping, Sequence

    from asynclock.state.mysql._wake import DedicatedConnection

__all__ = ["ANCHOR_LOST", "EAR_WAIT", "Anchor", "Ear", "EarListener", "InboxEar"]

logger = logging.getLogger("asynclock")

#: seconds an ear's wait lasts; an idle ear costs one statement per this
EAR_WAIT = 5
#: what an ear's statement answers when its ``GET_LOCK`` took the anchor's name (and gave it back)
ANCHOR_LOST = 2
#: seconds before a failed ear connection is opened again
RECONNECT_DELAY = 1.0
#: "Query execution was interrupted": what a statement killed outside its wait answers
INTERRUPTED = 1317


class Anchor:
    """A connection of the state's own that holds one named lock: what the state's ears wait on.

    :meth:`hold` opens it (and takes the name) when it is not open; an ear that found the name
    free calls :meth:`lost`, and the next :meth:`hold` opens it again. It runs no statement once
    it holds the name: an idle session, one per state however many ears wait on it.
    """

    __slots__ = ("_closed", "_conn", "_connect", "_op_timeout", "_opening", "name")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        *,
        op_timeout: float,
    ) -> None:
        #: the lock's name (at most 64 characters, as MySQL 5.7+ allows), unique to this anchor
        self.name = f"asynclock-ear-anchor:{uuid.uuid4().hex}"
        self._connect = connect
        self._op_timeout = op_timeout
        self._conn: DedicatedConnection | None = None
        self._opening = asyncio.Lock()
        self._closed = False

    async def hold(self) -> None:
        """Return once the anchor's connection holds the name (opening it within
        ``op_timeout`` if it does not)."""
        async with self._opening:  # a free asyncio.Lock is taken without a yield
            if self._conn is not None:
                return
            if self._closed:  # an ear still running past its state's close: it fails, and stops
                raise RuntimeError("the state is closed: its ears no longer wait")
            async with deadline_after(self._op_timeout):
                conn = await self._connect()
                try:
                    cursor = await conn.cursor()
                    await cursor.execute("SELECT GET_LOCK(%(name)s, 0)", {"name": self.name})
                    (taken,) = (await cursor.fetchall())[0]
                    await cursor.close()
                except BaseException:
                    conn.close()
                    raise
            if taken != 1:  # nobody else names it; a failure here is the server's
                conn.close()
                raise RuntimeError(f"the ear anchor could not take {self.name!r}: {taken!r}")
            self._conn = conn

    def lost(self) -> None:
        """An ear found the name free: the anchor's connection is gone; open it again."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def aclose(self) -> None:
        """Close the anchor's connection (the server frees the name with it), for good."""
        self._closed = True
        self.lost()


class EarListener(Protocol):
    """What an :class:`Ear` tells its owner."""

    async def opened(self, conn: DedicatedConnection, channel: str) -> None:
        """A new ear connection, whose ``CONNECTION_ID()`` is ``channel``: what to register.

        Runs before the ear's first wait on ``conn``, and may run statements on it (a
        registration made there is committed before the ear's first look); an exception drops
        the connection.
        """

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
        "_anchor",
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
        anchor: Anchor,
        op_timeout: float,
        role: str,
    ) -> None:
        """``statement`` waits ``%(wait)s`` seconds for the lock ``%(anchor)s`` unless what it
        waits for is there (answering :data:`ANCHOR_LOST` last when it took the lock); ``args``
        are its other parameters; ``role`` names the ear in logs and in its task's name."""
        self._connect = connect
        self._statement = statement
        self._anchor = anchor
        self._args = {**args, "wait": EAR_WAIT, "anchor": anchor.name}
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
                channel = str(rows[0][0])
                await self._listener.opened(conn, channel)
            except BaseException:
                conn.close()
                raise
        self._channel = channel
        return conn

    async def _listen(self, conn: DedicatedConnection | None) -> None:
        try:
            while True:
                try:
                    if conn is None:
                        conn = await self._open()
                        self._listener.lost()  # wake-ups may have gone to the old connection
                    answer: Sequence[object] | None = None
                    await self._anchor.hold()
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
                    if answer is not None and answer[-1] == ANCHOR_LOST:
                        self._anchor.lost()
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

    __slots__ = ("_ear", "_moved", "_watch", "_worker")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        statements: tuple[str, str],
        *,
        worker: str,
        anchor: Anchor,
        op_timeout: float,
    ) -> None:
        """``statements``: ``inbox_ear`` and ``inbox_ear_moved`` of ``queries.sql``; ``worker``:
        the id of the worker's row (its hint is what the ear looks for); ``anchor``: the
        state's."""
        statement, self._moved = statements
        self._worker = worker
        self._watch = HintWatch()
        self._ear = Ear(
            connect,
            statement,
            {"worker": worker},
            self,
            anchor=anchor,
            op_timeout=op_timeout,
            role="inbox",
        )

    async def start(self) -> HintWatch:
        """Open the ear and start listening; the watch the wake-ups arrive at."""
        await self._ear.start()  # the worker registers the ear's id: known before we return
        return self._watch

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        await self._ear.aclose()

    async def opened(self, conn: DedicatedConnection, channel: str) -> None:
        """See :meth:`EarListener.opened`: the id the worker's row names, written into the row
        (when it exists: a new worker registers it) before the ear's first look. An accept that
        wrote its hint before that look is seen by it; one that writes it after kills this id.
        Left to the lease's renewal, the row named the dead id for up to a third of the lease,
        and an accept then waited for the ear's whole wait (``docs/decisions.md``)."""
        self._watch.channel = channel
        cursor = await conn.cursor()
        try:
            await cursor.execute(self._moved, {"worker": self._worker})
        finally:
            await cursor.close()

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
