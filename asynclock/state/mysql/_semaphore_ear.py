"""Push wake-ups for the semaphore waiters of a MySQLState, through one :class:`~._ear.Ear`.

A state whose semaphore waiters wait keeps one ear (opened on the first wait): a connection of
its own parked in ``semaphore_ear``, a marked wait on the state's anchor. Each waiter's place names that ear's
``CONNECTION_ID()`` in its row of ``{prefix}semaphore_ears`` (written by the acquire that queues
it, no extra statement). A release or abandon that makes waiters eligible marks their rows and,
once committed, interrupts each of their ears once (``KILL QUERY``, ``semaphore_ring_v1``); the
ear then collects its marked rows (``semaphore_heard_v1``: read and deleted in one transaction)
and wakes exactly those waiters. A waiter of the releasing state itself is woken in process, its
row left unmarked.

Invariants:

* Only the waiters a release made eligible are woken: as many as permits it freed, never all.
* Idle waiters cost the server nothing but their place renewals: the ear sleeps ``EAR_WAIT``
  seconds per statement, one ear per state whatever the number of waiters and keys.
* No wake-up is lost for good. A kill between two ear statements is made up for by the next
  statement's first look (marked rows of its own). A collect interrupted by a kill (two releases
  rang at once: the second kill came just after the ear's statement ended) or chosen as a
  deadlock victim is rolled back and wakes every semaphore waiter of the state; one that fails otherwise drops the connection (the
  server rolls back its transaction) and does the same, and the waiters, asking again, name
  the new ear. Whatever else is lost (a kill refused: the waiter's state
  uses another database user without ``CONNECTION_ADMIN``) is bounded by the waiter's own
  wait, at most ``PLACE_REFRESH`` (1.7 s) or the refusal's ``retry_after`` if sooner.
* While the ear is down a waiter polls as before (:class:`~._wake.PollingWatch`): its acquire
  named no ear, so no release would ring for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock._compat import deadline_after
from asynclock.state.mysql._ear import INTERRUPTED, Ear, error_code
from asynclock.state.mysql._wake import PollingWatch

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Coroutine, Sequence

    from asynclock.state.mysql._ear import Anchor
    from asynclock.state.mysql._wake import DedicatedConnection

__all__ = ["EarWatch", "SemaphoreEar"]

#: errors that leave the ear's connection usable: interrupted by a kill, a deadlock victim, a
#: lock wait timeout
_ROLLED_BACK = frozenset({INTERRUPTED, 1213, 1205})


class SemaphoreEar:
    """The semaphore waiters' ear of one state (see the module); the listener of its ear.

    ``wake(where)`` wakes the watches of ``"<key id hex>:<owner>"``; ``wake_all()`` every
    semaphore watch of the state.
    """

    __slots__ = ("_ear", "_heard", "_op_timeout", "_wake", "_wake_all")

    def __init__(
        self,
        connect: Callable[[], Coroutine[object, object, DedicatedConnection]],
        statements: tuple[str, str],
        *,
        wake: Callable[[str], None],
        wake_all: Callable[[], None],
        anchor: Anchor,
        op_timeout: float,
    ) -> None:
        """``statements``: ``semaphore_ear`` and ``semaphore_heard`` of ``queries.sql``;
        ``anchor``: the state's."""
        ear_statement, self._heard = statements
        self._wake = wake
        self._wake_all = wake_all
        self._op_timeout = op_timeout
        self._ear = Ear(
            connect,
            ear_statement,
            {},
            self,
            anchor=anchor,
            op_timeout=op_timeout,
            role="semaphore",
        )

    @property
    def channel(self) -> int | None:
        """The ear's connection id (what a waiter's place names), ``None`` while it is down."""
        channel = self._ear.channel
        return int(channel) if channel is not None else None

    async def start(self) -> None:
        """Open the ear; its id is :attr:`channel` once this returns."""
        await self._ear.start()

    async def aclose(self) -> None:
        """Stop listening and close the ear's connection."""
        await self._ear.aclose()

    # -- EarListener ----------------------------------------------------------------------------

    async def opened(self, conn: DedicatedConnection, channel: str) -> None:
        """See :meth:`~._ear.EarListener.opened`: the acquires that queue name it from now."""

    def lost(self) -> None:
        """See :meth:`~._ear.EarListener.lost`: every waiter asks again (and names the new ear;
        until it is open, none does and the watches poll)."""
        self._wake_all()

    async def heard(self, conn: DedicatedConnection, answer: Sequence[object] | None) -> None:
        """See :meth:`~._ear.EarListener.heard`: unless the whole wait passed, collect the
        waiters marked for this ear and wake them."""
        if answer is not None and answer[1] == 0:
            return  # slept the whole wait: nothing was marked when it started, nobody rang
        async with deadline_after(self._op_timeout):
            try:
                rows = await _run(conn, self._heard)
            except Exception as exc:
                if error_code(exc) not in _ROLLED_BACK:
                    raise  # the ear drops the connection, its transaction with it
                # a second release's kill, meant for the ear's statement, came just after it
                # ended (or a release marking rows of one key in another order chose the
                # collect as its deadlock victim): end the collect's transaction, which may or
                # may not have committed, and wake every waiter (it may have deleted marks it
                # could not answer)
                await _run(conn, "ROLLBACK")
                self._wake_all()
                return
        heard = rows[0][0] if rows else None
        text = heard.decode() if isinstance(heard, (bytes, bytearray)) else str(heard or "")
        for where in text.split("\n"):
            if where:
                self._wake(where)


async def _run(conn: DedicatedConnection, statement: str) -> Sequence[Sequence[object]]:
    cursor = await conn.cursor()
    try:
        await cursor.execute(statement)
        return await cursor.fetchall()
    finally:
        await cursor.close()


class EarWatch(PollingWatch):
    """A semaphore waiter's watch on MySQL: woken in process or by the state's ear.

    While the ear is up, :meth:`wait` waits for a wake-up or the caller's whole ``timeout``
    (never polls); while it is down, it polls with :class:`PollingWatch`'s back-off.
    """

    __slots__ = ("_ear",)

    def __init__(self, loop: asyncio.AbstractEventLoop, ear: SemaphoreEar) -> None:
        super().__init__(loop)
        self._ear = ear

    async def wait(self, timeout: float) -> bool:
        """``True`` when woken, ``False`` after ``timeout`` (ear up) or the back-off (down)."""
        if self._ear.channel is not None:
            return await self._event.wait(timeout)
        return await super().wait(timeout)
