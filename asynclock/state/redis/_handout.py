"""A worker's side of the inbox's hand-out on Redis: BRPOP on the lanes, grants out.

The accept script hands a key nobody holds to one worker by reserving its lock and pushing a
grant onto the hand-out lane of the key's server (``_handout.lua``); every worker blocks in
``BRPOP`` on each lane (one per server: one on a single server, one per master on a cluster), and
Redis gives each grant to exactly one of them. So an event costs its accept, the BRPOP that
received it (sent before, counted once) and the drain's step: not one wake-up per worker.

Invariants:

* A lane is read by a *popper* task of its own, on a connection of its own that nothing else
  uses (a blocking command holds its connection), so a grant that arrives is never lost to a
  cancelled ``next()``: it waits in the worker's queue. A popper waits on its lane only while
  that queue is empty: a worker busy with as many keys as it may drain (it calls ``next()`` no
  more) leaves the grants to the other workers. A popper cancelled mid-BRPOP (the worker
  stops) may lose a grant on its way; the key's reservation then expires and a rescan finds it.
* A grant is drained only while its reservation surely holds: its age is measured against an
  upper bound of the server's clock (from ``TIME`` round trips: the offset never
  underestimates the server's time), and a grant that may have waited too long on the lane is
  checked first (``inbox_adopt.lua``: the reservation renewed, or the key taken afresh, or
  nothing), which costs one round trip only for such grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from typing import TYPE_CHECKING

from asynclock._compat import deadline_after
from asynclock._owner import new_owner
from asynclock.state._protocol import InboxEntry, InboxGrant
from asynclock.state._watch import EventWatch
from asynclock.state.redis._scripts import as_int, text
from asynclock.state.redis._transport import UNAVAILABLE

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio.connection import AbstractConnection

__all__ = ["LaneWorker"]

logger = logging.getLogger("asynclock")

#: seconds one BRPOP waits before it is sent again (an idle worker's cost: one command per this)
POP_WAIT = 5.0
#: seconds between two readings of the server's clock by one popper
CLOCK_EVERY = 30.0
#: seconds a popper waits before it reconnects after a failure
RECONNECT_DELAY = 0.5


class LaneWorker:
    """One ``serve()``'s poppers: a task per lane, the grants they got, oldest first."""

    __slots__ = (
        "_adopt",
        "_connect",
        "_connections",
        "_grants",
        "_lanes",
        "_lock_ttl",
        "_offset",
        "_op_timeout",
        "_poppers",
        "_room",
        "_watch",
        "_with_entry",
    )

    def __init__(
        self,
        *,
        lanes: Callable[[], Awaitable[list[str]]],
        connect: Callable[[str], Awaitable[AbstractConnection]],
        adopt: Callable[[str, str, float, bool, InboxEntry | None, bool], Awaitable[object]],
        lock_ttl: float,
        with_entry: bool,
        op_timeout: float,
    ) -> None:
        """``lanes()``: the lanes to wait on now; ``connect(lane)``: a new connection to the
        server of ``lane``; ``adopt(key, owner, ttl, with_entry, handed, bare)``:
        ``inbox_adopt.lua``'s reply for a grant that may have waited too long (``handed``: the
        entry it handed out; ``bare``: it came without the head this worker wants)."""
        self._lanes = lanes
        self._connect = connect
        self._adopt = adopt
        self._lock_ttl = lock_ttl
        self._with_entry = with_entry
        self._op_timeout = op_timeout
        self._grants: deque[InboxGrant] = deque()
        self._watch = EventWatch(asyncio.get_running_loop())
        #: set while no grant waits for ``next()``: a popper takes a grant off a lane only then,
        #: so a worker that drains as many keys as it may leaves the next grants to the others
        self._room = asyncio.Event()
        self._room.set()
        self._poppers: dict[str, asyncio.Task[None]] = {}
        #: each lane's connection now (tests kill them to see a popper come back)
        self._connections: dict[str, AbstractConnection] = {}
        #: an upper bound of (server clock - loop clock) in ms, from the TIME round trips
        self._offset: float | None = None

    async def start(self) -> None:
        """Start a popper on every lane."""
        for lane in await self._lanes():
            self._popper(lane)

    def _popper(self, lane: str) -> None:
        if lane not in self._poppers:
            task = asyncio.ensure_future(self._pop(lane))
            task.set_name(f"asynclock inbox lane {lane!r}")
            self._poppers[lane] = task

    async def next(self, timeout: float) -> InboxGrant | None:
        """See :meth:`asynclock.state.InboxWorker.next`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._grants:
                await asyncio.sleep(0)  # the yield rule
                return self._taken()
            self._watch.reset()
            if not await self._watch.wait(deadline - loop.time()):
                return self._taken() if self._grants else None

    def _taken(self) -> InboxGrant:
        grant = self._grants.popleft()
        if not self._grants:
            self._room.set()
        return grant

    async def _pop(self, lane: str) -> None:
        """Wait on ``lane`` for good, queueing each grant it hands this worker."""
        loop = asyncio.get_running_loop()
        conn: AbstractConnection | None = None
        clock_read_at = -CLOCK_EVERY
        try:
            while True:
                await self._room.wait()
                try:
                    if conn is None:
                        conn = self._connections[lane] = await self._connect(lane)
                    if loop.time() - clock_read_at >= CLOCK_EVERY:
                        await self._read_clock(conn)
                        clock_read_at = loop.time()
                    async with deadline_after(POP_WAIT + self._op_timeout):
                        await conn.send_command("BRPOP", lane, POP_WAIT)
                        reply = await conn.read_response()
                except UNAVAILABLE as exc:
                    logger.warning("asynclock: waiting on inbox lane %r failed: %r", lane, exc)
                    await _dropped(conn)
                    conn = None
                    await asyncio.sleep(RECONNECT_DELAY)
                    continue
                if reply is None:
                    continue  # nothing for POP_WAIT seconds: ask again
                assert isinstance(reply, list)
                grant = await self._checked(text(reply[1]))
                if grant is not None:
                    self._grants.append(grant)
                    self._room.clear()
                    self._watch.fire()
        finally:
            await _dropped(conn)

    async def _read_clock(self, conn: AbstractConnection) -> None:
        """Lower the bound on the server's clock with one ``TIME`` round trip."""
        loop = asyncio.get_running_loop()
        sent = loop.time() * 1000.0
        async with deadline_after(self._op_timeout):
            await conn.send_command("TIME")
            reply = await conn.read_response()
        assert isinstance(reply, list)
        # the server read its clock after we sent: (its ms - our ms at sending) never
        # underestimates the offset
        offset = as_int(reply[0]) * 1000.0 + as_int(reply[1]) / 1000.0 - sent
        self._offset = offset if self._offset is None else min(self._offset, offset)

    async def _checked(self, item: str) -> InboxGrant | None:
        """The grant ``item`` as this worker drains it: as it came, when its reservation surely
        has most of its TTL left, else after ``inbox_adopt.lua`` (``None``: nothing to drain).
        A grant without the head although this worker hands it out (``with_entry``; a
        requeue's or discard's, which knows no deployment's choice) gets it there too: one
        round trip, for an operator's command only. A grant with the head although this worker
        takes its batches itself (an accept of a dispatcher with another policy) gives the
        head's count back there, or the worker's take would count that delivery twice: one
        round trip, for such a deployment only."""
        key, owner, token, pushed_ms, reserved_ms, *head = json.loads(item)
        loop = asyncio.get_running_loop()
        handed = self._entry(head)
        bare = self._with_entry and handed is None
        unwanted = not self._with_entry and handed is not None
        if self._offset is not None and not bare and not unwanted:
            age = max(loop.time() * 1000.0 + self._offset - pushed_ms, 0.0)
            left = (reserved_ms - age) / 1000.0
            if left >= max(self._lock_ttl / 3, min(1.0, self._lock_ttl / 2)):
                return InboxGrant(key, owner, int(token), left, handed)
        sent = loop.time()
        try:
            reply = await self._adopt(key, owner, self._lock_ttl, self._with_entry, handed, bare)
        except Exception as exc:  # noqa: BLE001 - the key is left to its reservation's expiry
            logger.warning("asynclock: checking a grant of inbox %r failed: %r", key, exc)
            return None
        if not reply:
            return None  # another worker holds the key, or it was drained meanwhile
        left = self._lock_ttl - (loop.time() - sent)
        if text(reply) == "held":
            return InboxGrant(key, owner, int(token), left, None if unwanted else handed)
        key, owner, token, _, _, *head = json.loads(text(reply))
        return InboxGrant(key, owner, int(token), left, self._entry(head))

    def _entry(self, head: list[object]) -> InboxEntry | None:
        """The head entry a grant handed out (``"<id> <accepted ms> <payload>"``, its attempt
        count, the entries pending), or ``None``; its age by the bound on the server's clock."""
        if not head:
            return None
        raw, attempts, pending = head
        entry_id, accepted_ms, payload = str(raw).split(" ", 2)
        age = 0.0
        if self._offset is not None:
            now_ms = asyncio.get_running_loop().time() * 1000.0 + self._offset
            age = max(now_ms - int(accepted_ms), 0.0) / 1000.0
        return InboxEntry(int(entry_id), int(str(attempts)), payload, age, int(str(pending)))

    async def take(self, key: str) -> InboxGrant | None:
        """See :meth:`asynclock.state.InboxWorker.take` (``inbox_adopt.lua`` for a fresh owner:
        one round trip)."""
        sent = asyncio.get_running_loop().time()
        owner = new_owner()
        reply = await self._adopt(key, owner, self._lock_ttl, self._with_entry, None, False)
        if not reply or text(reply) == "held":
            return None
        key, owner, token, _, _, *head = json.loads(text(reply))
        left = self._lock_ttl - (asyncio.get_running_loop().time() - sent)
        return InboxGrant(key, owner, int(token), left, self._entry(head))

    async def aclose(self) -> None:
        """Stop every popper (a grant on its way may be lost: its reservation expires)."""
        poppers = tuple(self._poppers.values())
        self._poppers.clear()
        for task in poppers:
            task.cancel()
        await asyncio.gather(*poppers, return_exceptions=True)


async def _dropped(conn: AbstractConnection | None) -> None:
    """Close ``conn`` (mid-command: it cannot be reused)."""
    if conn is not None:
        with contextlib.suppress(Exception):
            await conn.disconnect()
