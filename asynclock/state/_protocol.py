"""The contract between the primitives (AsyncLock, Deduper, ...) and a state backend.

A backend is any object with these methods; it does not need to inherit from anything
(structural typing, like trio's ``_HasAcquireRelease``). ``tests/conformance`` runs every
backend through the same semantics, and a third-party backend can run that suite too.

Vocabulary used in every docstring below:

* **atomic against processes**: the operation is one server-side step (a Lua script, one SQL
  statement); no other client of the same server sees a half-done state. ``MemoryState`` is
  atomic against tasks and threads of one process only.
* **server clock**: expiry is decided by the backend's own clock (Redis ``PX``, SQL ``now()``,
  ``time.monotonic()`` for memory), never by the caller's wall clock.
* **owner**: an opaque string unique per acquisition (see ``asynclock._owner``).
* **token**: the fencing token: an ``int`` that is strictly greater than every token issued
  before for the same key by the same backend.

Size: over 500 lines, nearly all of them docstrings: this module is the contract, one
protocol per capability, and every method states what is atomic, against whom, and which
clock decides. Splitting it would scatter the one page a backend author reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Collection, Sequence
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType

    from typing_extensions import Self


@dataclass(frozen=True, slots=True)
class Grant:
    """The answer to :meth:`State.acquire`.

    Exactly one of the fields is set: ``token`` when the caller now holds the lock,
    ``retry_after`` (seconds until the current holder's lock expires) when it does not.
    ``retry_after`` may be ``0.0`` when the holder's lock is about to expire.
    """

    token: int | None
    retry_after: float | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """The answer to :meth:`State.release`.

    ``owned`` is ``False`` when the key was no longer held by the caller (nothing was changed).
    ``handoff_token`` is the successor's fencing token when the lock was handed over directly,
    ``None`` when it was released (or when the backend declined the handoff to serve a waiter
    in another process first; the successor must then acquire like anyone else).
    """

    owned: bool
    handoff_token: int | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """What :meth:`State.inspect` reports about a held lock.

    Example:
        >>> import asyncio
        >>> from asynclock import AsyncLock, MemoryState
        >>> async def main():
        ...     state = MemoryState()
        ...     async with AsyncLock(state, "contact:42", ttl=30.0) as lock:
        ...         info = await state.inspect("contact:42")
        ...         return info.owner == lock.owner, info.token == lock.token, info.remaining > 29
        >>> asyncio.run(main())
        (True, True, True)
    """

    key: str
    owner: str
    remaining: float
    token: int


@runtime_checkable
class Watch(Protocol):
    """A subscription to release notifications for one key (see :meth:`State.watch`)."""

    def reset(self) -> None:
        """Forget notifications received so far; call it right before each acquire attempt."""

    async def wait(self, timeout: float) -> bool:
        """Wait until a release of the key was announced after the last :meth:`reset`.

        Returns ``True`` when woken by a notification and ``False`` after ``timeout`` seconds.
        A notification may be lost (a dropped connection, a failover); callers therefore always
        bound ``timeout`` by the holder's remaining TTL, so they never wait past the expiry.
        """
        ...


@runtime_checkable
class State(Protocol):
    """Where locks and dedupe records live.

    Every method is a coroutine and every call yields to the event loop at least once.
    Backends raise :class:`asynclock.StateUnavailableError` (with the driver's error as
    ``__cause__``) when the server cannot be reached within their configured timeouts.

    Example:
        A backend implements the methods and inherits from nothing (see the docs' "Custom
        backends" page):

        >>> from asynclock import MemoryState, State
        >>> isinstance(MemoryState(), State), isinstance(object(), State)
        (True, False)
    """

    async def acquire(self, key: str, owner: str, ttl: float, *, waiting: bool = False) -> Grant:
        """Take ``key`` for ``owner`` for ``ttl`` seconds if nobody holds it (or it expired).

        Atomic against processes; expiry by the server clock. On success the grant carries a new
        fencing token; otherwise the holder's remaining time. Idempotent for one owner: repeating
        a call that already won (say, after a lost reply) returns the same token again.

        ``waiting=True`` tells the backend that the caller will block until the key is free, so
        the holder's process may give way to it instead of handing the lock to its own waiters
        (cross-process fairness); backends are free to ignore it.
        """
        ...

    async def release(
        self, key: str, owner: str, *, successor: str | None = None, ttl: float | None = None
    ) -> Release:
        """Release ``key`` if ``owner`` still holds it (compare-and-delete, atomic).

        With ``successor`` (and its ``ttl``), the backend may instead hand the lock straight to
        that new owner in the same atomic step, with a new fencing token: this is how a process
        serves its own queue of waiters without a release/acquire round trip. A release wakes
        the key's watchers.
        """
        ...

    async def abandon(self, key: str, owner: str) -> None:
        """Undo an acquire whose outcome the caller does not know (cancelled, timed out).

        Releases ``key`` if ``owner`` holds it, and makes sure that the abandoned acquire, should
        it still reach the server later, cannot grant ``owner`` the lock any more. Also
        withdraws this state instance's waiting flag or reservation on ``key`` (see
        ``acquire(waiting=True)``): the caller calls it when its process stops waiting. Atomic.
        """
        ...

    async def extend(self, key: str, owner: str, ttl: float) -> bool:
        """Reset the TTL of ``key`` to ``ttl`` seconds from now if ``owner`` still holds it.

        Compare-then-act, atomic. ``False`` means the lock is gone or held by someone else;
        it is never re-created.
        """
        ...

    async def inspect(self, key: str) -> LockInfo | None:
        """The current holder of ``key``, or ``None`` when nobody holds it."""
        ...

    async def dedupe_add(self, key: str, ttl: float) -> bool:
        """Record ``key`` for ``ttl`` seconds unless it is recorded already (atomic set-if-absent).

        ``True`` exactly once per key per TTL window, across every client of the backend.
        """
        ...

    async def dedupe_keep(self, key: str, ttl: float) -> None:
        """Set the record of ``key`` to expire ``ttl`` seconds from now, creating it if gone.

        Used to renew an "in progress" claim's lease and to turn it into a "done" record with
        the full dedupe TTL once the work succeeded. Atomic; a record made by
        :meth:`ClaimingState.acquire_claimed` keeps its owner.
        """
        ...

    async def dedupe_forget(self, key: str) -> bool:
        """Delete the record of ``key``; ``True`` if there was one."""
        ...

    def watch(self, key: str) -> AbstractAsyncContextManager[Watch]:
        """Subscribe to release notifications of ``key`` for the duration of the block.

        The subscription is active when ``__aenter__`` returns, so a release that happens after
        it (even before the first ``wait``) is not missed.
        """
        ...

    async def aclose(self) -> None:
        """Release the backend's resources. A backend given a client does not close it."""
        ...

    async def __aenter__(self) -> Self:
        """Return the state itself."""
        ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the state (:meth:`aclose`)."""
        ...


@runtime_checkable
class ClaimingState(Protocol):
    """Optional capability: a dedupe claim and a lock acquire in one atomic step.

    The dispatcher uses it so a fresh event costs one round trip before its handler runs
    (claim + lock) and one after (release + marking the claim done). States without it get
    separate calls (two before the handler, two after).
    """

    async def acquire_claimed(
        self, key: str, owner: str, ttl: float, *, claim: str, claim_ttl: float
    ) -> Grant | None:
        """Record dedupe ``claim`` for ``claim_ttl`` seconds if it is new, and then acquire.

        Returns ``None`` when the claim was already recorded (a duplicate: nothing is acquired
        and nothing changes); otherwise exactly what :meth:`State.acquire` would return for a
        non-waiting caller, with the claim recorded whether or not the lock was free. Atomic.
        The claim is recorded as ``owner``'s (see :meth:`forget_claimed`). On a cluster,
        ``claim`` must share ``key``'s hash tag (``"...{key}..."``).
        """
        ...

    async def forget_claimed(self, claim: str, owner: str) -> bool:
        """Delete dedupe ``claim`` only if ``owner``'s :meth:`acquire_claimed` recorded it.

        Compare-and-delete, atomic; ``True`` when it was deleted. The dispatcher forgets an
        unhandled event's claim with it even when it does not know whether its own
        ``acquire_claimed`` landed (cancelled, timed out): a duplicate delivery then never
        erases the record of the delivery that was handled.
        """
        ...

    async def release_claimed(
        self,
        key: str,
        owner: str,
        *,
        claim: str,
        claim_ttl: float,
        successor: str | None = None,
        ttl: float | None = None,
    ) -> Release:
        """:meth:`State.release`, and in the same atomic step :meth:`State.dedupe_keep` of ``claim``.

        The dispatcher marks a handled event's claim *done* (the full dedupe TTL) with the
        release of its lock, so a fresh event still costs two round trips. The claim's record is
        set to expire ``claim_ttl`` seconds from now (created if gone) whether or not ``owner``
        still held the lock; the answer is what :meth:`State.release` would return.
        """
        ...


@runtime_checkable
class DedupeReading(Protocol):
    """Optional capability: how long a dedupe record has left, in one read.

    The dispatcher asks it only about a duplicate, to tell a claim still *in progress* (its
    lease, at most ``lock_ttl``, is renewed while the first delivery runs) from a *done* record
    (written for ``dedupe_ttl + lock_ttl``): an endpoint then answers an in-progress duplicate
    with a retry, so a dead worker's event is redelivered once its lease lapses.
    """

    async def dedupe_remaining(self, key: str) -> float | None:
        """Seconds until the record of ``key`` expires (server clock); ``None`` when it has none.

        One read; changes nothing. An expired record counts as absent.
        """
        ...


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


@runtime_checkable
class SupersedeWatch(Protocol):
    """Supersede signals for one key, subscribed before its lock is taken (see
    :class:`SupersedeSignals`)."""

    def aim(self, token: int) -> None:
        """Listen for signals aimed at fencing ``token`` (the lock just taken), counting those
        heard since the subscription began."""

    def reset(self) -> None:
        """Forget the signals heard so far (a later one for the aimed token wakes again)."""

    async def wait(self, timeout: float) -> bool:
        """``True`` once a signal for the aimed token was heard, ``False`` after ``timeout``."""
        ...


@runtime_checkable
class SupersedeSignals(Protocol):
    """Optional capability: tell a key's lock holder, in any process, that a newer event came.

    Used by ``EventDispatcher(on_lock_conflict="supersede")``. A signal names the holder by its
    fencing token, so one aimed at a holder that has gone never reaches its successor. It is a
    push (Redis pub/sub, PostgreSQL ``NOTIFY``, MySQL's ear woken by ``KILL QUERY``, a direct
    call on ``MemoryState``); a signal may be lost (a dropped connection), so the sender sends
    it again each time it checks the key while waiting. Never durable: it concerns a running
    call only.
    """

    async def supersede(self, key: str, token: int) -> None:
        """Signal the holder of ``key`` whose fencing token is ``token`` (no-op if none)."""
        ...

    def supersede_watch(self, key: str) -> AbstractAsyncContextManager[SupersedeWatch]:
        """Subscribe to ``key``'s supersede signals for the block; active once entered, so the
        holder subscribes before taking the lock and misses no signal for its token."""
        ...

    async def supersede_carry(self, key: str, events: Sequence[str], ttl: float) -> None:
        """Leave ``events`` (encoded events, oldest first) for the next call of ``key``.

        Called by an interrupted holder, still holding the key, whose newer event arrived in
        another process: that process's call takes them with :meth:`supersede_collect` and
        sees them in ``ctx.skipped``. Appended after any events left before and not yet
        collected; all of them expire ``ttl`` seconds after this call if nobody collects them.
        """
        ...

    async def supersede_collect(self, key: str) -> list[str]:
        """Take every event left for ``key`` by :meth:`supersede_carry` and not expired, oldest
        first, removing them (one atomic step: two collectors never both get one)."""
        ...


@runtime_checkable
class LockAdmin(Protocol):
    """Optional capability for operators: list the locks held now, and force one free.

    Used by ``asynclock locks`` and ``asynclock unlock``; never by the primitives.
    """

    def held_locks(self, match: str = "*") -> AsyncIterator[LockInfo]:
        """Yield every lock held now whose key matches the glob ``match`` (``*``, ``?``, ``[]``).

        Walks the keyspace incrementally (Redis ``SCAN``, never ``KEYS``), so a large state is
        listed without blocking the server; a lock taken or released meanwhile may or may not
        appear.
        """
        ...

    async def force_release(self, key: str) -> LockInfo | None:
        """Release ``key`` whoever holds it; returns the holder it had, or ``None``.

        The holder is not told: its next ``extend`` or ``release`` raises
        ``LockNotOwnedError``, and its fencing token is already lower than the next one.
        """
        ...


@runtime_checkable
class FairState(Protocol):
    """Optional capability: fair turns for retried calls and jobs, across processes.

    Per key, a *line* of turns ordered by the time each first met the key busy (by the state's
    clock). A turn is an opaque id that stays the same across the retries of one job. A place in
    the line is kept only until the ``hold`` its last attempt asked for, so a job that vanished
    cannot block the key for longer than that.

    Only :meth:`fair_acquire` honours the line; a plain :meth:`State.acquire` ignores it.
    """

    async def fair_acquire(
        self, key: str, owner: str, ttl: float, *, turn: str, hold: float
    ) -> Grant:
        """:meth:`State.acquire` (not waiting), taken only in turn; one atomic step.

        First the places whose hold ran out leave the line. Then, if the line is empty or
        ``turn`` is at its head, the key is acquired as :meth:`State.acquire` would, and on
        success ``turn`` leaves the line. Otherwise (the key is held, or another turn is ahead)
        nothing is acquired: ``turn`` joins the line if it is not in it (its place: now) and its
        place is kept until ``hold`` seconds after the holder's lock expires (after now, when
        the key is free). The
        refusal's ``retry_after`` is the holder's remaining TTL, or, when the key is free but
        reserved for an earlier turn, the time that turn's place is still kept.
        """
        ...

    async def fair_leave(self, key: str, turn: str) -> None:
        """Take ``turn`` out of ``key``'s line (it gave up, or was served another way)."""
        ...


@dataclass(frozen=True, slots=True)
class SemaphoreInfo:
    """What :meth:`SemaphoreState.semaphore_inspect` reports about one semaphore key.

    ``holders`` are the live permits, oldest token first (each a :class:`LockInfo` whose
    ``remaining`` is the permit's seconds left); ``waiting`` counts the places kept in the key's
    queue of waiters.
    """

    key: str
    holders: tuple[LockInfo, ...]
    waiting: int


@runtime_checkable
class SemaphoreState(Protocol):
    """Optional capability: counted permits per key (``asynclock.Semaphore``), fair and fenced.

    Per key (a namespace of its own: a semaphore and a lock may share a key string), the state
    keeps the live *holders* (owner, fencing token, expiry by the server clock) and a *queue* of
    waiters in arrival order (owner, the ``limit`` it asked with, and until when its place is
    kept). A free permit goes to the oldest waiter first: a waiter at position ``i`` (0 = the
    head) may take one only while, for it and every waiter ahead of it, ``held + position <
    limit`` (strict FIFO, whatever limits the waiters asked with); a caller not in the queue
    counts as standing at its end.

    Every method is one atomic step against every client of the backend (memory: of the
    process), with expiry by the server's clock. A dead holder's permit frees when its TTL runs
    out; a dead waiter's place when its hold runs out. Tokens come from the same rule as lock
    tokens: strictly greater than every token issued before for the key.
    """

    async def semaphore_acquire(
        self, key: str, owner: str, limit: int, ttl: float, *, hold: float | None = None
    ) -> Grant:
        """Take a permit of ``key`` for ``owner`` for ``ttl`` seconds, if one is free in turn.

        Atomic; expiry by the server clock. Expired holders and places are dropped first. If
        ``owner`` holds a permit already (a retried call whose reply was lost), its TTL is reset
        to ``ttl`` from now and the same token is returned. Otherwise a permit is granted (new
        fencing token) when fewer than ``limit`` are held and every waiter ahead of the caller
        fits too (see the class); the caller then leaves the queue.

        ``hold=None`` is a try: a refusal changes nothing. With ``hold`` (seconds) the caller
        will wait: on refusal it joins the queue at its end (or keeps its place) and the place
        is kept until ``hold`` seconds from now; the caller renews it by calling again.

        An owner given up by :meth:`semaphore_abandon` is never granted nor queued while its
        mark lives. A refusal's ``retry_after`` is the seconds until the state changes without
        a release: the first expiry among the live permits and the places kept ahead of the
        caller (``0.0`` if imminent).
        """
        ...

    async def semaphore_release(self, key: str, owner: str) -> bool:
        """Give back ``owner``'s permit of ``key`` (compare-and-delete, atomic).

        ``False`` (nothing changed) when ``owner`` holds none (expired, released). A release
        wakes the waiters it made eligible (their :meth:`semaphore_watch`).
        """
        ...

    async def semaphore_abandon(self, key: str, owner: str) -> None:
        """Undo an acquire of unknown outcome, or stop waiting: atomic.

        Gives back ``owner``'s permit if it holds one, takes it out of the queue, and marks it
        so that an acquire still on its way cannot grant it a permit nor a place later. Wakes
        the waiters this made eligible.
        """
        ...

    async def semaphore_extend(self, key: str, owner: str, ttl: float) -> bool:
        """Reset ``owner``'s permit to expire ``ttl`` seconds from now (compare-then-act).

        ``False`` when it holds none; a lost permit is never re-created.
        """
        ...

    async def semaphore_inspect(self, key: str) -> SemaphoreInfo:
        """The live holders of ``key`` and how many places its queue keeps. One read."""
        ...

    def semaphore_watch(self, key: str, owner: str) -> AbstractAsyncContextManager[Watch]:
        """Wake-ups for waiter ``owner`` of ``key``, for the duration of the block.

        Active when ``__aenter__`` returns. The watch wakes when a release (or an abandon) made
        ``owner`` eligible; it may also wake spuriously. A backend without a push path may
        return a watch that wakes after a bounded back-off (the caller bounds every wait by the
        refusal's ``retry_after``).
        """
        ...
