"""The durable inbox (:class:`~asynclock.state.InboxState`) of the SQL states, driver-free.

:class:`SQLInboxState` adds the inbox operations to :class:`~asynclock.state.sql._state.SQLState`:
parameters in, answers out, the same for PostgreSQL and MySQL. Each operation is one named
statement of the backend's ``queries.sql``; the three that change several rows (accept, step,
take, requeue) call a function (PostgreSQL) or procedure (MySQL) of its ``schema.sql``, one
transaction that first locks the key's row of ``{table_prefix}inboxes``, so the accepts and
drain steps of one key run one after the other across every process. A backend supplies only
how its answer reads as rows (:meth:`SQLInboxState._rows`) and how an inbox watch hears of
accepts elsewhere (a NOTIFY, or bounded polling).

An implementation detail shared by two backends, not part of the contract.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, TypeVar

from asynclock._errors import LockNotOwnedError
from asynclock._validate import check_key, check_limit, check_ttl, ttl_ms
from asynclock.state._protocol import (
    DeadLetter,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxKey,
)
from asynclock.state.sql._queries import key_id
from asynclock.state.sql._state import SQLState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Collection, Sequence

    from asynclock.state.sql._driver import WakeableWatch

__all__ = ["SQLInboxState"]

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")


class SQLInboxState(SQLState[C, S, R]):
    """A SQL state with the durable inbox: per key, a FIFO of rows drained under the key's lock.

    Invariants (each enforced by the statements, against every process):

    * Entry ids increase in accept order per key; the head is the pending entry with the lowest
      id, so dead letters put back by :meth:`inbox_requeue` (they keep their ids) come first.
    * ``inbox_accept`` records the claim, checks ``max_pending`` and appends in one transaction
      serialized per key on the key's inboxes row: of concurrent accepts of one event exactly
      one is ``"accepted"``, and a key never holds more than ``max_pending`` entries.
    * ``inbox_step`` and ``inbox_take`` change nothing unless the caller holds the key's lock,
      and release the lock in their own transaction when nothing is pending (release-if-empty).
    * The inbox rows are never deleted by :meth:`purge_expired`; a key's rows go when its last
      entry is done (dead letters stay until requeued and handled).
    """

    # -- the driver's part ------------------------------------------------------------------

    @abc.abstractmethod
    def _rows(self, answer: R) -> Sequence[Sequence[object]]:
        """The rows of a statement's answer (each a sequence of column values)."""

    def _accepted_here(self) -> None:
        """This state appended an entry: wake its inbox watchers (unless the server does)."""
        self._wake_inbox()

    def _inbox_found_work(self) -> None:
        """A rescan (``inbox_ready``) found keys to drain (a polling backend polls sooner)."""

    # -- plumbing ---------------------------------------------------------------------------

    @functools.cached_property
    def _space(self) -> bytes:
        """The id of this state's key prefix: the inbox rows of one prefix carry it."""
        return key_id(self._prefix)

    @property
    def _inbox_channel(self) -> str:
        return f"{self._table_prefix}inbox"

    def _wake_inbox(self) -> None:
        for watch in tuple(self._inbox_watches):
            watch.fire()

    def _inbox_notified(self, payload: str) -> None:
        """A NOTIFY of an accept (payload: the prefix's id in hex): wake ours if it is ours."""
        if payload == self._space.hex():
            self._wake_inbox()

    # -- the InboxState protocol -------------------------------------------------------------

    async def inbox_accept(
        self, key: str, payload: str, *, claim: str | None, claim_ttl: float, max_pending: int
    ) -> InboxAccepted:
        """See :meth:`asynclock.state.InboxState.inbox_accept` (``inbox_accept`` in
        ``queries.sql``: one statement, one transaction; returns after its commit)."""
        check_key(key)
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        ident, full = self._ids(key)
        claim_id, claim_name = self._ids(claim) if claim is not None else (None, None)
        answer = await self._run(
            "inbox_accept",
            {
                "id": self._id_param(ident),
                "name": full,
                "space": self._id_param(self._space),
                "payload": payload,
                "claim": self._id_param(claim_id) if claim_id is not None else None,
                "claim_name": claim_name,
                "claim_ttl_ms": ttl_ms(check_ttl(claim_ttl, "claim_ttl")),
                "max_pending": max_pending,
                "channel": self._inbox_channel,
                "wake": self._space.hex(),
            },
            idempotent=False,  # repeated, an accept without a claim would append twice
        )
        status, pending = self._rows(answer)[0][:2]
        accepted = InboxAccepted(_text(status), _int(pending))
        if accepted.status == "accepted":
            self._accepted_here()
        self._maybe_purge()
        return accepted

    async def inbox_step(
        self,
        key: str,
        owner: str,
        *,
        done: int | None = None,
        dead: str | None = None,
        take: bool = True,
    ) -> InboxEntry | None:
        """See :meth:`asynclock.state.InboxState.inbox_step` (``inbox_step`` in ``queries.sql``).

        Raises:
            LockNotOwnedError: ``owner`` does not hold ``key``'s lock (nothing changed).
        """
        ident, _ = self._ids(key)
        hex_id = ident.hex()
        answer = await self._run(
            "inbox_step",
            {
                "id": self._id_param(ident),
                "owner": owner,
                "done": done,
                "dead": dead if done is not None else None,
                "take": bool(take),
                "reservation_ms": self._reservation_ms,
                "channel": self._channel,
                "payload": hex_id,
            },
            idempotent=False,
        )
        row = self._rows(answer)[0]
        status = _text(row[0])
        if status == "not_owner":
            raise LockNotOwnedError(key, owner)
        if status == "released":
            self._released_here(hex_id)
            return None
        return InboxEntry(_int(row[1]), _int(row[2]), _text(row[3]), _float(row[4]), _int(row[5]))

    async def inbox_take(
        self,
        key: str,
        owner: str,
        *,
        done: Collection[int] = (),
        dead: str | None = None,
        limit: int,
    ) -> InboxBatch | None:
        """See :meth:`asynclock.state.InboxState.inbox_take` (``inbox_take`` in ``queries.sql``).

        Raises:
            LockNotOwnedError: ``owner`` does not hold ``key``'s lock (nothing changed).
        """
        check_limit(limit)
        ids = ",".join(str(int(entry)) for entry in done)
        ident, _ = self._ids(key)
        hex_id = ident.hex()
        answer = await self._run(
            "inbox_take",
            {
                "id": self._id_param(ident),
                "owner": owner,
                "done": ids,
                "dead": dead if ids else None,
                "limit": limit,
                "reservation_ms": self._reservation_ms,
                "channel": self._channel,
                "payload": hex_id,
            },
            idempotent=False,
        )
        rows = self._rows(answer)
        head = next(row for row in rows if _text(row[0]) != "entry")
        status = _text(head[0])
        if status == "not_owner":
            raise LockNotOwnedError(key, owner)
        if status == "released":
            self._released_here(hex_id)
            return None
        pending = _int(head[5])
        entries = sorted(
            InboxEntry(_int(row[1]), _int(row[2]), _text(row[3]), _float(row[4]), pending)
            for row in rows
            if _text(row[0]) == "entry"
        )
        return InboxBatch(tuple(entries), pending, _float(head[4]))

    async def inbox_ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready` (one indexed read).

        Keys whose lock is held right now are left out: their holder drains them, and a worker
        that rescans could only fail to take them. Once the lock is free (or expired) they are
        listed again.
        """
        answer = await self._run(
            "inbox_ready", {"space": self._id_param(self._space)}, idempotent=True
        )
        start = len(self._prefix)
        keys = [_text(row[0])[start:] for row in self._rows(answer)]
        if keys:
            self._inbox_found_work()
        return keys

    @contextlib.asynccontextmanager
    async def inbox_watch(self) -> AsyncIterator[WakeableWatch]:
        """See :meth:`asynclock.state.InboxState.inbox_watch`.

        An accept through this state wakes the watch at once; how accepts of other processes
        are heard is the backend's (see its module).
        """
        watch = self._new_watch(asyncio.get_running_loop())
        await self._listen()
        self._inbox_watches.add(watch)
        try:
            yield watch
        finally:
            self._inbox_watches.discard(watch)

    async def inbox_keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys` (one read)."""
        answer = await self._run(
            "inbox_keys", {"space": self._id_param(self._space)}, idempotent=True
        )
        start = len(self._prefix)
        return [
            InboxKey(_text(name)[start:], _int(pending), _float(age), _int(dead))
            for name, pending, age, dead in self._rows(answer)
        ]

    async def inbox_dead_letters(self, key: str) -> list[DeadLetter]:
        """See :meth:`asynclock.state.InboxState.inbox_dead_letters` (one read, in id order)."""
        ident, _ = self._ids(key)
        answer = await self._run(
            "inbox_dead_letters", {"id": self._id_param(ident)}, idempotent=True
        )
        return [
            DeadLetter(key, _int(entry), _int(attempts), _text(error), _text(payload))
            for entry, attempts, error, payload in self._rows(answer)
        ]

    async def inbox_requeue(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_requeue` (``inbox_requeue`` in
        ``queries.sql``: one statement, one transaction)."""
        ident, _ = self._ids(key)
        answer = await self._run(
            "inbox_requeue",
            {
                "id": self._id_param(ident),
                "channel": self._inbox_channel,
                "wake": self._space.hex(),
            },
            idempotent=False,
        )
        moved = _int(self._rows(answer)[0][0])
        if moved:
            self._accepted_here()
        return moved


def _text(value: object) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _int(value: object) -> int:
    return int(_text(value))  # a driver may answer an int, a Decimal or digits as bytes


def _float(value: object) -> float:
    return float(_text(value))
