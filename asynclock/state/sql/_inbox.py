"""The durable inbox (:class:`~asynclock.state.InboxState`) of the SQL states, driver-free.

:class:`SQLInboxState` adds the inbox operations to :class:`~asynclock.state.sql._state.SQLState`:
parameters in, answers out, the same for PostgreSQL and MySQL. Each operation is one named
statement of the backend's ``queries.sql``; those that change several rows (accept, step, take,
requeue, discard, the hand-out's claim) call a function (PostgreSQL) or procedure (MySQL) of its ``schema.sql``, one
transaction that first locks the key's row of ``{table_prefix}inboxes``, so the accepts and
drain steps of one key run one after the other across every process. A backend supplies only
how its answer reads as rows (:meth:`SQLInboxState._rows`) and how an inbox watch hears of
accepts elsewhere (a NOTIFY, or bounded polling).

An implementation detail shared by two backends, not part of the contract.
"""

from __future__ import annotations

import abc
import functools
from typing import TYPE_CHECKING, TypeVar

from asynclock._errors import LockNotOwnedError
from asynclock._validate import check_inbox_finish, check_key, check_limit, check_ttl, ttl_ms
from asynclock.state._protocol import (
    DeadLetter,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxKey,
)
from asynclock.state.sql._handout import SQLWorker
from asynclock.state.sql._queries import key_id
from asynclock.state.sql._state import SQLState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Collection, Mapping, Sequence
    from contextlib import AbstractAsyncContextManager

    from asynclock.state.sql._handout import WakeWatch

__all__ = ["WAKE_GAP_MS", "SQLInboxState"]

#: ms within which an accept wakes nobody else for a key a worker was woken for already (a burst
#: of accepts for one free key costs one wake-up; a wake-up lost costs this much, or a rescan)
WAKE_GAP_MS = 1000

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
      entry is done (dead letters stay until requeued and handled, or discarded).
    * A retry that waits (its due time, by the server's clock) and a parked key are columns of
      the key's inboxes row, set by the step that releases the lock: no lock is held meanwhile,
      and the claim, ``inbox_ready`` and an accept's wake-up pass over the key until it is due
      (a retry) or requeued or discarded (parked).
    """

    # -- the driver's part ------------------------------------------------------------------

    @abc.abstractmethod
    def _wake_ups(self, worker: str, channel: str) -> AbstractAsyncContextManager[WakeWatch]:
        """Hear the hand-out's wake-ups of ``worker`` (its row names ``channel``), while in the
        context (see :class:`~asynclock.state.sql._handout.WakeUps`)."""

    # -- plumbing ---------------------------------------------------------------------------

    @functools.cached_property
    def _space(self) -> bytes:
        """The id of this state's key prefix: the inbox rows of one prefix carry it."""
        return key_id(self._prefix)

    # -- the InboxState protocol -------------------------------------------------------------

    async def inbox_accept(
        self,
        key: str,
        payload: str,
        *,
        claim: str | None,
        claim_ttl: float,
        max_pending: int,
        lock_ttl: float = 30.0,
        with_entry: bool = True,
    ) -> InboxAccepted:
        """See :meth:`asynclock.state.InboxState.inbox_accept` (``inbox_accept`` in
        ``queries.sql``: one statement, one transaction; returns after its commit; a key nobody
        holds wakes one worker, which claims it: ``_handout.py``)."""
        check_key(key)
        if not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an int >= 1, got {max_pending!r}")
        check_ttl(lock_ttl, "lock_ttl")
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
                "wake_gap_ms": WAKE_GAP_MS,
            },
            idempotent=False,  # repeated, an accept without a claim would append twice
        )
        status, pending = self._rows(answer)[0][:2]
        accepted = InboxAccepted(_text(status), _int(pending))
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
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxEntry | None:
        """See :meth:`asynclock.state.InboxState.inbox_step` (``inbox_step`` in ``queries.sql``).

        Raises:
            LockNotOwnedError: ``owner`` does not hold ``key``'s lock (nothing changed).
            ValueError: a bad ``retry_in`` / ``park`` (see
                :func:`asynclock._validate.check_inbox_finish`).
        """
        wait = check_inbox_finish(key, done=done, dead=dead, retry_in=retry_in, park=park)
        params = {"done": done, "dead": dead if done is not None else None, "take": bool(take)}
        answer = await self._inbox_finish("inbox_step", key, owner, wait, park, params)
        if answer is None:
            return None
        row = answer[1]
        return InboxEntry(_int(row[1]), _int(row[2]), _text(row[3]), _float(row[4]), _int(row[5]))

    async def inbox_take(
        self,
        key: str,
        owner: str,
        *,
        done: Collection[int] = (),
        dead: str | None = None,
        limit: int,
        retry_in: float | None = None,
        park: bool = False,
    ) -> InboxBatch | None:
        """See :meth:`asynclock.state.InboxState.inbox_take` (``inbox_take`` in ``queries.sql``).

        Raises:
            LockNotOwnedError: ``owner`` does not hold ``key``'s lock (nothing changed).
            ValueError: a bad ``limit``, ``retry_in`` or ``park`` (see
                :func:`asynclock._validate.check_inbox_finish`).
        """
        check_limit(limit)
        finished = frozenset(done)
        wait = check_inbox_finish(key, done=finished, dead=dead, retry_in=retry_in, park=park)
        ids = ",".join(str(int(entry)) for entry in sorted(finished))
        params = {"done": ids, "dead": dead if ids else None, "limit": limit}
        answer = await self._inbox_finish("inbox_take", key, owner, wait, park, params)
        if answer is None:
            return None
        rows, head = answer
        pending = _int(head[5])
        entries = sorted(
            InboxEntry(_int(row[1]), _int(row[2]), _text(row[3]), _float(row[4]), pending)
            for row in rows
            if _text(row[0]) == "entry"
        )
        return InboxBatch(tuple(entries), pending, _float(head[4]))

    async def _inbox_finish(
        self,
        name: str,
        key: str,
        owner: str,
        wait: float | None,
        park: bool,
        params: Mapping[str, object],
    ) -> tuple[Sequence[Sequence[object]], Sequence[object]] | None:
        """Run the step ``name`` (``inbox_step``, ``inbox_take``: ``params`` are its own) as
        ``owner`` on ``key``: its rows and its status row (the first that is not an ``'entry'``
        row, else the first), or ``None`` when it released the lock.

        Raises:
            LockNotOwnedError: ``owner`` does not hold ``key``'s lock (nothing changed).
        """
        ident, _ = self._ids(key)
        hex_id = ident.hex()
        answer = await self._run(
            name,
            {
                "id": self._id_param(ident),
                "owner": owner,
                **params,
                "retry_ms": ttl_ms(wait) if wait is not None else None,
                "park": park,
                "reservation_ms": self._reservation_ms,
                "channel": self._channel,
                "payload": hex_id,
            },
            idempotent=False,
        )
        rows = self._rows(answer)
        head = next((row for row in rows if _text(row[0]) != "entry"), rows[0])
        status = _text(head[0])
        if status == "not_owner":
            raise LockNotOwnedError(key, owner)
        if status == "released":
            self._released_here(hex_id)
            return None
        return rows, head

    async def inbox_ready(self) -> list[str]:
        """See :meth:`asynclock.state.InboxState.inbox_ready` (one indexed read).

        Keys whose lock is held right now are left out: their holder drains them, and a worker
        that rescans could only fail to take them. Once the lock is free (or expired) they are
        listed again.
        """
        answer = await self._run(
            "inbox_ready", {"space": self._id_param(self._space)}, idempotent=True
        )
        self._maybe_purge()  # an idle worker's rescans purge too, not only the next traffic
        start = len(self._prefix)
        return [_text(row[0])[start:] for row in self._rows(answer)]

    def inbox_worker(
        self, *, lock_ttl: float, with_entry: bool
    ) -> AbstractAsyncContextManager[SQLWorker]:
        """See :meth:`asynclock.state.InboxState.inbox_worker` (a row of ``inbox_workers``, a
        wake-up of its own, one ``inbox_claim`` per wake-up: ``_handout.py``)."""
        check_ttl(lock_ttl, "lock_ttl")

        def claim(
            owner: str, ttl: float, take: bool, hint: bytes | None
        ) -> Awaitable[Sequence[object]]:
            return self._inbox_claim(owner, ttl, take, hint, worker=worker.id)

        worker = SQLWorker(
            claim=claim,
            seen=self._inbox_worker_seen,
            key_id=lambda key: self._ids(key)[0],
            lock_ttl=lock_ttl,
            with_entry=with_entry,
            channel_prefix=self._table_prefix,
        )
        return worker.registered(self._wake_ups(worker.id, worker.channel), self._inbox_worker_gone)

    async def _inbox_claim(
        self, owner: str, ttl: float, take: bool, hint: bytes | None, *, worker: str
    ) -> Sequence[object]:
        """The ``inbox_claim`` row of ``worker`` (see ``_handout.py``)."""
        answer = await self._run(
            "inbox_claim",
            {
                "space": self._id_param(self._space),
                "owner": owner,
                "ttl_ms": ttl_ms(ttl),
                "take": take,
                "hint": self._id_param(hint) if hint is not None else None,
                "worker": worker,  # PostgreSQL: the claim reads the hint in the worker's row
            },
            idempotent=False,
        )
        row = list(self._rows(answer)[0])
        if row[1] is not None:
            row[1] = _text(row[1])[len(self._prefix) :]  # the prefixed name: the key
        return row

    async def _inbox_worker_seen(self, worker: str, channel: str, lease: float) -> object:
        return await self._run(
            "inbox_worker_seen",
            {
                "worker": worker,
                "space": self._id_param(self._space),
                "channel": channel,
                "lease_ms": ttl_ms(lease),
                **self._worker_row(worker),
            },
            idempotent=True,
        )

    def _worker_row(self, worker: str) -> Mapping[str, object]:
        """The backend's own columns of ``worker``'s row in ``inbox_worker_seen`` (none here)."""
        return {}

    async def _inbox_worker_gone(self, worker: str) -> object:
        return await self._run("inbox_worker_gone", {"worker": worker}, idempotent=True)

    async def inbox_keys(self) -> list[InboxKey]:
        """See :meth:`asynclock.state.InboxState.inbox_keys` (one read)."""
        answer = await self._run(
            "inbox_keys", {"space": self._id_param(self._space)}, idempotent=True
        )
        start = len(self._prefix)
        return [
            InboxKey(
                _text(name)[start:],
                _int(pending),
                _float(age),
                _int(dead),
                _float(retry_in) if retry_in is not None else None,
                _bool(parked),
            )
            for name, pending, age, dead, retry_in, parked in self._rows(answer)
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
        ``queries.sql``: one statement, one transaction; a key nobody holds wakes one worker)."""
        ident, _ = self._ids(key)
        answer = await self._run(
            "inbox_requeue",
            {"id": self._id_param(ident), "space": self._id_param(self._space)},
            idempotent=False,
        )
        return _int(self._rows(answer)[0][0])

    async def inbox_discard(self, key: str) -> int:
        """See :meth:`asynclock.state.InboxState.inbox_discard` (``inbox_discard`` in
        ``queries.sql``: one statement, one transaction; a key left with work that nobody holds
        wakes one worker)."""
        check_key(key)
        ident, _ = self._ids(key)
        answer = await self._run(
            "inbox_discard",
            {"id": self._id_param(ident), "space": self._id_param(self._space)},
            idempotent=False,  # repeated, it would answer 0: the count of the first is lost
        )
        return _int(self._rows(answer)[0][0])


def _text(value: object) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _int(value: object) -> int:
    return int(_text(value))  # a driver may answer an int, a Decimal or digits as bytes


def _float(value: object) -> float:
    return float(_text(value))


def _bool(value: object) -> bool:
    if isinstance(value, (bool, int)):
        return bool(value)
    return _text(value).lower() in ("1", "t", "true")
