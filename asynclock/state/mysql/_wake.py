"""Cross-process release wake-ups for MySQLState, through the server's named locks.

MySQL and MariaDB have no LISTEN/NOTIFY, but a session blocked in ``GET_LOCK(name, t)`` returns
the moment the session holding ``name`` runs ``RELEASE_LOCK(name)`` (or ends). So a state that
holds a contended key also holds the key's *wake name* on a dedicated connection of its own (the
bell), and frees it right after the release statement commits; a state waiting for the key blocks
in ``GET_LOCK`` of the wake name on another dedicated connection (the ear), then re-checks the key.

Invariants:

* Pooled connections never hold a named lock: the bell and the ear are two connections of
  their own per state, opened on first use, never lent to an operation.
* A wake-up is never lost: the ear asks ``IS_FREE_LOCK`` and ``GET_LOCK`` in one statement, after
  the waiter's failed check. A wake name already free (the holder released it, or never held it)
  answers "free" at once and the waiter re-checks: at once the first time, after the polling
  back-off after that (the holder does not ring: bounded polling, as without the bell).
* The ear takes the wake name only for the instant of its statement (``GET_LOCK`` then
  ``RELEASE_LOCK`` in one ``SELECT``, evaluated left to right), so it never keeps a holder from
  taking it nor keeps other waiters waiting.
* A bell or ear that fails (killed, server gone) is dropped; its named locks die with its session,
  which wakes the waiters on them, who re-check. Until it reconnects (at most once per
  ``RECONNECT_DELAY``), the watches poll with the bounded back-off.
* A state holds wake names only for *hot* keys: keys it had to wait for itself (its ``acquire``
  with ``waiting=True`` failed), the most recent ``MAX_HOT`` of them; uncontended locks pay no
  extra statement.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from asynclock._compat import deadline_after
from asynclock.state._watch import EventWatch

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence

__all__ = [
    "MAX_HOT",
    "MAX_PUSH_WAIT",
    "RECONNECT_DELAY",
    "DedicatedConnection",
    "PollingWatch",
    "PushWatch",
    "WakeChannel",
    "wake_name",
]

logger = logging.getLogger("asynclock")

#: seconds one ``GET_LOCK`` wait of the ear lasts (whole seconds: MySQL 8 takes no fraction). An
#: idle waiter costs one statement per this, and another key of the state waits this long at most
#: for the ear (polling meanwhile)
MAX_PUSH_WAIT = 1
#: keys a state keeps hot (holds the wake name of while it holds them)
MAX_HOT = 1024
#: seconds between attempts to reopen a bell or ear that failed
RECONNECT_DELAY = 1.0

#: the back-off of a waiter without the ear (busy with another key, or down)
FIRST_POLL = 0.005
MAX_POLL = 0.1
#: the first back-off after the wake name was found free twice running (then doubling)
FIRST_MISS = 0.001

#: what one wait of the ear ended with
RUNG, FREE, TIMED_OUT, FAILED = "rung", "free", "timed out", "failed"


class DedicatedCursor(Protocol):
    """The part of a cursor a connection of its own uses."""

    async def execute(self, query: str, args: Mapping[str, object] | None = None) -> int: ...
    async def fetchall(self) -> Sequence[Sequence[object]]: ...
    async def close(self) -> None: ...


class DedicatedConnection(Protocol):
    """The part of ``aiomysql.Connection`` a connection of its own (bell, ear) uses."""

    def cursor(self) -> Awaitable[DedicatedCursor]: ...
    def close(self) -> None: ...


def wake_name(table_prefix: str, ident: str) -> str:
    """The named lock that stands for key ``ident`` (hex id) of tables ``table_prefix``.

    Named locks are server-wide and at most 64 characters: a digest keeps it short; two
    databases with the same table prefix share names, which costs a spurious re-check only.
    """
    digest = hashlib.sha256(f"{table_prefix}\0{ident}".encode()).hexdigest()
    return f"asynclock:{digest[:48]}"


class _Link:
    """One dedicated connection, opened on demand, dropped on failure, reopened after a pause."""

    __slots__ = ("_conn", "_connect", "_op_timeout", "_retry_at", "_role")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        op_timeout: float,
        role: str,
    ) -> None:
        self._connect = connect
        self._op_timeout = op_timeout
        self._role = role
        self._conn: DedicatedConnection | None = None
        self._retry_at = 0.0

    def down(self) -> bool:
        """Whether the connection failed less than ``RECONNECT_DELAY`` ago."""
        return self._conn is None and asyncio.get_running_loop().time() < self._retry_at

    async def query(
        self, statement: str, args: Mapping[str, object], wait: float
    ) -> Sequence[object]:
        """The first row of ``statement``; raises (and drops the connection) on any failure."""
        try:
            async with deadline_after(wait + self._op_timeout):
                if self._conn is None:
                    self._conn = await self._connect()
                cursor = await self._conn.cursor()
                try:
                    await cursor.execute(statement, args)
                    rows = await cursor.fetchall()
                finally:
                    await cursor.close()
        except BaseException as exc:
            self.drop()
            if not isinstance(exc, asyncio.CancelledError):
                logger.debug("asynclock: MySQL wake-up %s connection failed: %r", self._role, exc)
            raise
        return rows[0]

    def drop(self) -> None:
        """Close the connection (its named locks go with its session) and pause reconnects."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        self._retry_at = asyncio.get_running_loop().time() + RECONNECT_DELAY


class WakeChannel:
    """The bell (holds wake names of keys this state holds) and the ear (waits on others').

    The ear waits for one key at a time; the watches of that key join its wait (its task's
    outcome: ``"rung"``, ``"free"``, ``"timed out"`` or ``"failed"``).
    """

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        *,
        table_prefix: str,
        op_timeout: float,
    ) -> None:
        self._table_prefix = table_prefix
        self._bell = _Link(connect, op_timeout, "bell")
        self._ear = _Link(connect, op_timeout, "ear")
        #: keys this state waited for lately (hex ids, most recent last)
        self._hot: OrderedDict[str, None] = OrderedDict()
        #: wake names the bell holds (by hex id), as far as this state has sent
        self._held: set[str] = set()
        #: bell statements not sent yet: (hex id, take) in order
        self._pending: list[tuple[str, bool]] = []
        self._ringer: asyncio.Task[None] | None = None
        self._listening: tuple[str, asyncio.Task[str]] | None = None
        self._closed = False

    # -- the holder's side ------------------------------------------------------------------

    @property
    def hot(self) -> bool:
        """Whether any key is hot (else a successful acquire has nothing to hold)."""
        return bool(self._hot)

    def waited(self, ident: str) -> None:
        """This state had to wait for key ``ident``: hold its wake name when it gets it."""
        self._hot[ident] = None
        self._hot.move_to_end(ident)
        if len(self._hot) > MAX_HOT:
            self._hot.popitem(last=False)

    def acquired(self, ident: str) -> None:
        """This state took key ``ident``: hold its wake name if the key is hot."""
        if ident in self._hot and ident not in self._held and not self._closed:
            self._held.add(ident)
            self._send(ident, take=True)

    def released(self, ident: str) -> None:
        """This state freed key ``ident``: free its wake name, which wakes the other states."""
        if ident in self._held:
            self._held.discard(ident)
            self._send(ident, take=False)

    def _send(self, ident: str, *, take: bool) -> None:
        self._pending.append((ident, take))
        if self._ringer is None:
            self._ringer = asyncio.get_running_loop().create_task(self._ring())

    async def _ring(self) -> None:
        """Send the pending bell statements, all queued so far in one ``SELECT``, in order."""
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                if self._bell.down():
                    self._held.clear()  # its session is gone, and every wake name with it
                    continue
                calls = ", ".join(
                    f"GET_LOCK(%(n{i})s, 0)" if take else f"RELEASE_LOCK(%(n{i})s)"
                    for i, (_, take) in enumerate(batch)
                )
                names = {
                    f"n{i}": wake_name(self._table_prefix, ident)
                    for i, (ident, _) in enumerate(batch)
                }
                try:
                    row = await self._bell.query(f"SELECT {calls}", names, 0.0)
                except Exception:  # noqa: BLE001 - dropped and logged: the session frees its locks
                    self._held.clear()
                    continue
                for (ident, take), answer in zip(batch, row, strict=True):
                    if take and answer != 1 and (ident, True) not in self._pending:
                        # taken for an instant by a waiter's ear, or not yet freed by the last
                        # holder: this holding does not ring (its waiters' back-off applies)
                        self._held.discard(ident)
        finally:
            self._ringer = None

    # -- the waiter's side ------------------------------------------------------------------

    def listen(self, ident: str) -> asyncio.Task[str] | None:
        """The ear's wait for key ``ident``: the one in flight, or a new one.

        ``None`` when the ear waits for another key or is down: the caller polls.
        """
        if self._closed:
            return None
        if self._listening is not None:
            key, task = self._listening
            return task if key == ident else None
        if self._ear.down():
            return None
        task = asyncio.get_running_loop().create_task(self._hear(ident, MAX_PUSH_WAIT))
        self._listening = (ident, task)
        return task

    async def _hear(self, ident: str, wait: int) -> str:
        name = wake_name(self._table_prefix, ident)
        try:
            try:
                free, got, _ = await self._ear.query(
                    "SELECT IS_FREE_LOCK(%(n)s), GET_LOCK(%(n)s, %(wait)s), RELEASE_LOCK(%(n)s)",
                    {"n": name, "wait": wait},
                    wait,
                )
            except Exception:  # noqa: BLE001 - dropped and logged: the watch polls meanwhile
                return FAILED
        finally:
            self._listening = None
        if free == 1:
            return FREE
        if got == 0:
            return TIMED_OUT
        return RUNG  # released (or the holder's bell died: re-checking is right either way)

    async def aclose(self) -> None:
        """Stop waiting and ringing; close both connections (freeing every wake name held)."""
        self._closed = True
        ringer, listening = self._ringer, self._listening
        tasks: list[asyncio.Future[None] | asyncio.Future[str]] = []
        if ringer is not None:
            tasks.append(ringer)
        if listening is not None:
            tasks.append(listening[1])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self._bell.drop()
        self._ear.drop()
        self._held.clear()


class PollingWatch:
    """Release notifications for one key where the server pushes none (MySQL's fallback).

    A release made through the same :class:`~asynclock.MySQLState` sets the event at once.
    Otherwise :meth:`wait` returns ``False`` after a back-off shorter than ``timeout`` (5 ms,
    doubling to 100 ms), so the caller re-checks the key: at most about ten attempts a second
    per waiting state and key, never past the holder's remaining TTL (the caller's ``timeout``).
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


class PushWatch(PollingWatch):
    """Release notifications for one key of a MySQLState: local releases, the ear, or polling.

    :meth:`wait` has the state's ear wait for the key's wake name (see :class:`WakeChannel`),
    joining its wait when it already listens for this key. When the ear listens for another key
    or is down, it polls as :class:`PollingWatch` does. A wake name found free means that the
    holder rang already, or has not taken it yet (its acquire committed a moment ago), or does not
    ring: the first time the caller re-checks at once, then after a back-off of ``FIRST_MISS``
    doubling to ``MAX_POLL`` seconds, listening again each time; once the back-off reached
    ``MAX_POLL`` it polls and listens again only once per ``MAX_PUSH_WAIT`` (a holder that does
    not ring costs about what polling alone costs).
    """

    __slots__ = ("_channel", "_deaf_until", "_ident", "_loop", "_miss_delay")

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: WakeChannel, ident: str) -> None:
        super().__init__(loop)
        self._loop = loop
        self._channel = channel
        self._ident = ident
        self._miss_delay = 0.0
        self._deaf_until = 0.0

    async def wait(self, timeout: float) -> bool:
        """``True`` when a release was announced, ``False`` after a timeout or the back-off."""
        heard = None
        if self._loop.time() >= self._deaf_until:
            heard = self._channel.listen(self._ident)
        if heard is None:
            return await super().wait(timeout)
        heard.add_done_callback(self._heard)
        try:
            woken = await self._event.wait(timeout)
        finally:
            heard.remove_done_callback(self._heard)  # a later wait must not hear this one
        if not heard.done() or heard.cancelled():
            return woken  # a release through this state (or the timeout)
        outcome = heard.result()
        if outcome == RUNG:
            self._miss_delay = 0.0
            return True
        if outcome == TIMED_OUT:
            return False
        self._event.reset()  # set by _heard, not by a release
        if outcome == FAILED:
            return await super().wait(timeout)
        delay, self._miss_delay = (
            self._miss_delay,
            min(max(self._miss_delay * 2, FIRST_MISS), MAX_POLL),
        )
        if not delay:
            return True  # most likely the new holder's bell is a moment late: look again now
        if delay >= MAX_POLL:
            # this holder does not ring: plain polling (one re-check per MAX_POLL), listening
            # again only once per MAX_PUSH_WAIT, when another holder may have the key
            self._deaf_until = self._loop.time() + MAX_PUSH_WAIT
            self._delay = MAX_POLL
        return await self._event.wait(min(delay, max(timeout, 0.0)))

    def _heard(self, _: object) -> None:
        self.fire()
