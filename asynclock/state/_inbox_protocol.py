"""The durable inbox's part of the state contract (see :mod:`asynclock.state._protocol`).

The capability behind ``EventDispatcher.accept`` / ``serve``: :class:`InboxState` with its
worker side of the hand-out (:class:`InboxWorker`), the records they hand out, and
:class:`DurabilityCheck`, which the inbox asks before it promises durability. The vocabulary
(atomic against processes, server clock, owner, token) is the one of ``_protocol.py``;
``_protocol.py`` names every class of this module too.

Size: close to 500 lines, nearly all docstrings: every step states what is atomic, against
whom, and what it hands out; the inbox's contract is one page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import Collection
    from contextlib import AbstractAsyncContextManager

__all__ = [
    "DeadLetter",
    "DurabilityCheck",
    "InboxAccepted",
    "InboxBatch",
    "InboxEntry",
    "InboxGrant",
    "InboxKey",
    "InboxState",
    "InboxWorker",
]


class InboxEntry(NamedTuple):
    """An entry of a key's inbox, as :meth:`InboxState.inbox_step` (the head) or
    :meth:`InboxState.inbox_take` (the oldest pending ones) hands it to its drainer."""

    #: the entry's number in its key's inbox (increasing in accept order)
    id: int
    #: deliveries of this entry so far, this one included (1 for the first)
    attempt: int
    #: the event, as :meth:`InboxState.inbox_accept` stored it
    payload: str
    #: seconds since the entry was accepted (by the state's clock)
    age: float
    #: entries pending in the key's inbox, this one included
    pending: int = 1


class InboxBatch(NamedTuple):
    """What :meth:`InboxState.inbox_take` hands its drainer when entries are pending."""

    #: the entries handed out, oldest first (at most ``limit``; none with ``limit=0``)
    entries: tuple[InboxEntry, ...]
    #: entries pending in the key's inbox after the step (those handed out included)
    pending: int
    #: seconds since the newest pending entry was accepted (by the state's clock)
    quiet: float


class InboxAccepted(NamedTuple):
    """What :meth:`InboxState.inbox_accept` did."""

    #: ``"accepted"``, ``"duplicate"`` or ``"full"``
    status: str
    #: entries pending for the key after the call
    pending: int


class InboxGrant(NamedTuple):
    """A key handed to one worker by :meth:`InboxWorker.next`: its lock is held for ``owner``.

    The worker drains the key as ``owner`` (its steps are fenced by that owner, as after an
    acquire) and renews the lock while it does; ``expires_in`` tells how long the lock surely
    has left, so the first renewal comes in time.
    """

    key: str
    #: the owner id the key's lock is held for (unique per hand-out, as an acquire's)
    owner: str
    #: the lock's fencing token (higher than every token issued for the key before)
    token: int
    #: seconds the lock had left when the worker got the grant (by the state's clock; a lower
    #: bound: the worker renews it before then)
    expires_in: float
    #: the key's head entry, handed out with its attempt counted (``with_entry=True``), or
    #: ``None``: the worker takes the key's entries itself (:meth:`InboxState.inbox_take`)
    entry: InboxEntry | None = None


class InboxKey(NamedTuple):
    """One key of :meth:`InboxState.inbox_keys`: its pending entries, dead letters, and whether
    it waits for a retry or is parked.

    ``retry_in`` and ``parked`` have defaults, so a custom backend written before them still
    builds its keys with four fields.
    """

    key: str
    pending: int
    #: seconds since the oldest pending entry was accepted (0.0 when none is pending)
    oldest_age: float
    dead: int
    #: seconds until the head waiting for a retry is due (``inbox_step(retry_in=...)``), by
    #: the state's clock; 0.0 once due but not yet taken; ``None`` when no retry waits
    retry_in: float | None = None
    #: the key is parked (``park=True``): nothing is handed out until a requeue or a discard
    parked: bool = False


class DeadLetter(NamedTuple):
    """An entry given up after its last attempt (``dead=`` of :meth:`InboxState.inbox_step` or
    :meth:`InboxState.inbox_take`)."""

    key: str
    id: int
    attempts: int
    error: str
    payload: str


@runtime_checkable
class InboxState(Protocol):
    """Optional capability: the durable inbox behind ``EventDispatcher.accept`` / ``serve``.

    Per key, a FIFO of entries stored in the state (on a server: durable once the call
    returns), drained by whoever holds the key's *lock* (the same lock as ``acquire``), one
    entry at a time (:meth:`inbox_step`) or in batches of the oldest (:meth:`inbox_take`), in
    accept order. An entry leaves only through a fenced step of the lock's holder.
    """

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
        """Append ``payload`` to ``key``'s inbox, atomically with its dedupe record.

        Atomic against every process: if ``claim`` is recorded (not expired) nothing is appended
        (``"duplicate"``); if ``max_pending`` entries are pending nothing is appended
        (``"full"``); else the entry is appended, ``claim`` is recorded for ``claim_ttl``
        seconds and the key is marked as having work. Returns once the server confirmed the
        write.

        The hand-out: if nobody holds the key's lock, the key is handed to **one** worker
        (:meth:`inbox_worker`), never to all of them. A backend may do it in the accept itself
        (reserve the lock for ``lock_ttl`` seconds for a fresh owner and queue the grant, with
        the head entry handed out when ``with_entry``) or wake one worker that then takes the
        key. While the lock is held nobody is woken: the holder's next step, atomic with this
        accept, takes the entry (or its release-if-empty came first, and this accept found the
        key free).
        """
        ...

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
        """As ``owner``, holder of ``key``'s lock: finish the head, then hand out the next.

        One atomic step, fenced by the lock: if ``owner`` does not hold the lock it raises
        :class:`LockNotOwnedError` and changes nothing. ``done`` (an entry id) removes that
        entry if it is the head; with ``dead`` (the error text) as well, it is moved to the
        key's dead letters instead. Then, if an entry is pending, its attempt count is
        incremented and it is returned, the lock kept; if none is, the lock is **released in the
        same step** (release-if-empty: an entry accepted meanwhile is never stranded, since its
        accept then finds the key free and wakes a drainer) and ``None`` is returned. With
        ``take=False`` (a drainer that stops) the next entry is only looked at: returned with
        its attempt count unchanged and the lock kept (the caller releases it), or, when there
        is none, the lock released as above.

        A retry that waits (``retry_in`` seconds > 0, with ``done`` = the head's id and no
        ``dead``): the head **stays** at the head with its attempt count unchanged and becomes
        due ``retry_in`` seconds from now by the state's clock; the lock is released in the
        same step, and ``None`` is returned. Until due, the key is not handed out by accepts,
        not listed by :meth:`inbox_ready` and not taken by :meth:`InboxWorker.take`; accepts
        append behind it (``max_pending`` counts it). Once due, it is a free key with work like
        any other: listed, taken (the head handed out with its attempt counted one more), or
        handed out by an accept that finds it due and free.

        Parking (``park=True``, with ``done`` and ``dead``): the head moves to the dead letters
        and the key is **parked**, the lock released in the same step, ``None`` returned. A
        parked key is never handed out, listed or taken, whatever is pending behind it, until
        :meth:`inbox_requeue` or :meth:`inbox_discard`; accepts still append (up to
        ``max_pending``).

        A key that waits for a retry or is parked holds no lock, and both survive any crash
        (they are in the state).

        Raises:
            LockNotOwnedError: ``owner`` does not hold the key's lock (nothing changed).
            ValueError: ``retry_in`` is not finite seconds > 0, ``retry_in`` without ``done``
                or with ``dead`` or ``park``, ``park`` without ``dead`` (see
                :func:`asynclock._validate.check_inbox_finish`, which every backend calls).
        """
        ...

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
        """As ``owner``, holder of ``key``'s lock: finish ``done``, then hand out up to ``limit``.

        The batch form of :meth:`inbox_step` (for ``latest`` / ``debounce``, which fold what is
        pending into one handler call). One atomic step, fenced by the lock: if ``owner`` does
        not hold the lock it raises :class:`LockNotOwnedError` and changes nothing. Every pending
        entry whose id is in ``done`` is removed (wherever it is in the inbox); with ``dead``
        (the error text) as well, each is moved to the key's dead letters instead, with its
        attempt count. Then, if entries are pending, the oldest ``limit`` of them (``limit >=
        0``) have their attempt counts incremented and are returned in accept order, the lock
        kept; with ``limit=0`` nothing is handed out (a drainer that only finishes entries,
        stops, or waits for the key to go quiet) and the batch tells ``pending`` and ``quiet``.
        If none is pending, the lock is **released in the same step** (release-if-empty, as in
        :meth:`inbox_step`) and ``None`` is returned.

        Attempt counts are per entry: an entry handed out again (its call failed, or its drainer
        died) counts one more delivery; one never handed out has its count unchanged.

        ``retry_in`` and ``park`` mean what they mean for :meth:`inbox_step`: with ``retry_in``
        (and a non-empty ``done``, no ``dead``) the ``done`` entries stay pending with their
        counts unchanged and the key waits ``retry_in`` seconds; with ``dead`` and ``park`` the
        ``done`` entries go to the dead letters and the key parks. Either way the lock is
        released in the same step, ``limit`` hands nothing out, and ``None`` is returned.

        Raises:
            LockNotOwnedError: ``owner`` does not hold the key's lock (nothing changed).
            ValueError: a bad ``limit``, or ``retry_in`` / ``park`` as for :meth:`inbox_step`.
        """
        ...

    async def inbox_ready(self) -> list[str]:
        """The keys with pending entries whose lock nobody holds, oldest first (neither parked
        nor waiting for a retry that is not due yet).

        The safety net of the hand-out (a worker that starts, or rescans every few seconds): it
        finds the keys of a worker that died, and any key whose hand-out was lost. A backend may
        list a held key too (its acquire then fails); it never leaves out a free one.
        """
        ...

    def inbox_worker(
        self, *, lock_ttl: float, with_entry: bool
    ) -> AbstractAsyncContextManager[InboxWorker]:
        """This process's place in the hand-out, for the life of one ``serve()``.

        Keys with work and no holder are handed out by :meth:`inbox_accept` (and
        :meth:`inbox_requeue`) to exactly one worker, which gets them from
        :meth:`InboxWorker.next` with the lock already held for it (``lock_ttl`` seconds from
        the hand-out; with ``with_entry`` the head entry comes along, handed out). The workers
        and the accepts of one deployment pass the same ``lock_ttl`` and ``with_entry``.
        A worker that dies holding grants loses nothing: their locks expire and the keys are
        found again by the rescan (:meth:`inbox_ready`).
        """
        ...

    async def inbox_keys(self) -> list[InboxKey]:
        """Every key with pending entries or dead letters, or waiting for a retry, or parked
        (for ``asynclock inbox``), with its ``retry_in`` and ``parked``."""
        ...

    async def inbox_dead_letters(self, key: str) -> list[DeadLetter]:
        """``key``'s dead letters, oldest first."""
        ...

    async def inbox_requeue(self, key: str) -> int:
        """Put ``key``'s dead letters back at the head of its inbox, in their order; how many.

        Atomic against every process. The key is unparked; the requeued entries start again at
        attempt 0 (their next delivery is attempt 1). A retry that waits is not cut short (the
        key stays waiting until it is due, the requeued entries first). If the key then has work
        and is free, it is handed out to one worker, as an accept does.
        """
        ...

    async def inbox_discard(self, key: str) -> int:
        """Delete ``key``'s dead letters; how many.

        Atomic against every process. The key is unparked, and if entries are pending and it is
        free (and no retry waits), it is handed out to one worker, as an accept does.
        """
        ...


class InboxWorker(Protocol):
    """One worker's side of the inbox's hand-out (:meth:`InboxState.inbox_worker`).

    Invariant: a grant reaches one worker only, with the key's lock held for the grant's owner;
    a worker that does not drain a grant it got leaves the key to the lock's expiry.
    """

    async def next(self, timeout: float) -> InboxGrant | None:
        """The next key handed to this worker, waiting up to ``timeout`` seconds (``None``).

        Cancelled while waiting, it may lose a grant on its way (the key is then found again by
        a rescan once the lock expired); it never hands one out twice.
        """
        ...

    async def take(self, key: str) -> InboxGrant | None:
        """Take ``key``, found by a rescan (:meth:`InboxState.inbox_ready`), as a hand-out does.

        One atomic step: if the key has pending entries and nobody holds its lock, the lock is
        taken for a fresh owner of this worker (the head handed out with ``with_entry``) and the
        grant returned; else ``None``. A backend may hand out another free key with work
        instead (the key found is then taken by whoever gets to it).
        """
        ...


@runtime_checkable
class DurabilityCheck(Protocol):
    """Optional capability: a state that can tell whether its server keeps what it confirmed.

    The durable inbox promises that an accepted event survives any crash, which holds only as
    far as the server keeps its writes. ``EventDispatcher.accept`` and ``serve`` call
    :meth:`check_durability` before their first inbox operation, and again only until it
    answers ``True``; the state decides what to check and logs what it finds (``RedisState``:
    whether each master keeps an append-only file).
    """

    async def check_durability(self) -> bool:
        """Check, once per state instance, whether the server persists what it confirms, and
        log one warning on the ``asynclock`` logger when it does not.

        Returns ``True`` once the check is settled (made, or turned off): the caller need not
        ask again, and a later call sends nothing. ``False``: it could not be made now (the
        server is out of reach, or another caller's check is in flight): ask again later.
        Never raises ``StateUnavailableError``: the check is advice, and the operation the
        caller is about to run reports an outage itself.
        """
        ...
