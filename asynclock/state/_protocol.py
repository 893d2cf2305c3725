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

Size: just over 500 lines, nearly all of them docstrings: this module is the contract, one
protocol per capability, and every method states what is atomic, against whom, and which
clock decides. The durable inbox's part, the largest, lives in ``_inbox_protocol.py`` (named
here too); the rest stays together, the one page a backend author reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

# the inbox's part of the contract (_inbox_protocol.py), named here too: this module stays the
# one place that names every capability
from asynclock.state._inbox_protocol import (
    DeadLetter,
    DurabilityCheck,
    InboxAccepted,
    InboxBatch,
    InboxEntry,
    InboxGrant,
    InboxKey,
    InboxState,
    InboxWorker,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence
    from contextlib import AbstractAsyncContextManager
    from types import TracebackType

    from typing_extensions import Self


__all__ = [
    "ClaimingState",
    "DeadLetter",
    "DedupeReading",
    "DurabilityCheck",
    "FairState",
    "Grant",
    "InboxAccepted",
    "InboxBatch",
    "InboxEntry",
    "InboxGrant",
    "InboxKey",
    "InboxState",
    "InboxWorker",
    "LockAdmin",
    "LockInfo",
    "Release",
    "SemaphoreInfo",
    "SemaphoreState",
    "State",
    "SupersedeSignals",
    "SupersedeWatch",
    "Watch",
]


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
