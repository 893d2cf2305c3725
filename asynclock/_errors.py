"""The whole exception tree of asynclock.

One root, :class:`AsynclockError`, so ``except asynclock.AsynclockError`` catches everything the
library raises on purpose. Bad input stays a builtin :class:`ValueError` / :class:`TypeError`, and
local misuse (re-entering one lock object, releasing a lock another task holds) stays a
:class:`RuntimeError`: those are bugs in the calling code, not conditions to handle.
"""

from __future__ import annotations


class AsynclockError(Exception):
    """Root of every error asynclock raises on purpose.

    Example:
        >>> import asynclock
        >>> [issubclass(error, asynclock.AsynclockError) for error in (
        ...     asynclock.LockAcquisitionError, asynclock.StateUnavailableError, ValueError)]
        [True, True, False]
    """


class LockError(AsynclockError):
    """Something went wrong with a lock (base class)."""


class LockAcquisitionError(LockError):
    """The lock could not be acquired: it is held by someone else.

    This is the error :func:`asynclock.retry_on_lock_conflict` retries.

    Attributes:
        key: the lock's key.
        ttl: the TTL (seconds) the acquirer asked for.
        retry_after: seconds until the current holder's lock expires, as the server reported at
            the last attempt, or ``None`` when unknown. The holder may release earlier, or extend.

    Example:
        >>> import asyncio
        >>> from asynclock import AsyncLock, LockAcquisitionError, MemoryState
        >>> async def main():
        ...     state = MemoryState()
        ...     async with AsyncLock(state, "report:daily", ttl=60.0):
        ...         try:
        ...             async with AsyncLock(state, "report:daily", blocking=False):
        ...                 pass
        ...         except LockAcquisitionError as exc:
        ...             return exc.key, 59.0 < exc.retry_after <= 60.0
        >>> asyncio.run(main())
        ('report:daily', True)
    """

    def __init__(
        self, key: str, ttl: float, retry_after: float | None, message: str | None = None
    ) -> None:
        self.key = key
        self.ttl = ttl
        self.retry_after = retry_after
        if message is None:
            when = (
                f"the holder's lock expires in {retry_after:.3f} s"
                if retry_after is not None
                else "the holder's remaining time is unknown"
            )
            message = f"could not acquire lock {key!r}: it is held by someone else ({when})"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[LockAcquisitionError], tuple[str, float, float | None, str]]:
        return (type(self), (self.key, self.ttl, self.retry_after, str(self)))


class LockNotOwnedError(LockError):
    """The server says this acquisition no longer holds the lock (it expired, or was taken over).

    Raised by :meth:`AsyncLock.extend` and :meth:`AsyncLock.release`. It is an *external*
    condition, like a broken connection: the lock's TTL ran out before the holder finished.

    Attributes:
        key: the lock's key.
        owner: the owner id of the acquisition that lost the lock.

    Example:
        >>> import asyncio
        >>> from asynclock import AsyncLock, LockNotOwnedError, MemoryState
        >>> now = 0.0
        >>> state = MemoryState(clock=lambda: now)
        >>> async def main():
        ...     global now
        ...     lock = AsyncLock(state, "invoice:7", ttl=10.0)
        ...     await lock.acquire()
        ...     now += 11.0                        # the holder stalled past its TTL
        ...     try:
        ...         await lock.extend()
        ...     except LockNotOwnedError as exc:
        ...         return exc.key, exc.owner == lock.owner
        >>> asyncio.run(main())
        ('invoice:7', True)
    """

    def __init__(self, key: str, owner: str, message: str | None = None) -> None:
        self.key = key
        self.owner = owner
        if message is None:
            message = (
                f"lock {key!r} is no longer held by {owner!r}: its TTL ran out or it was "
                "force-released, and another acquirer may hold it now"
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[type[LockNotOwnedError], tuple[str, str, str]]:
        return (type(self), (self.key, self.owner, str(self)))


class LockLostError(LockError):
    """An auto-renewed lock was lost while its body ran; the body was cancelled.

    ``async with AsyncLock(..., auto_renew=True)`` raises this when a renewal found the lock gone
    (or could not reach the server before the lock's TTL ran out), or when ``max_lifetime`` ran
    out. ``lock.lost`` is then ``True``.

    Attributes:
        key: the lock's key.
        owner: the owner id of the acquisition that was lost.

    Example:
        ``max_lifetime`` caps how long ``auto_renew`` keeps a lock; then the body is cancelled:

        >>> import asyncio
        >>> from asynclock import AsyncLock, LockLostError, MemoryState
        >>> async def main():
        ...     lock = AsyncLock(MemoryState(), "report:daily", ttl=0.3, auto_renew=True,
        ...                      max_lifetime=0.1)
        ...     try:
        ...         async with lock:
        ...             await asyncio.sleep(5)         # cancelled after 0.1 s
        ...     except LockLostError as exc:
        ...         return exc.key, lock.lost
        >>> asyncio.run(main())
        ('report:daily', True)
    """

    def __init__(self, key: str, owner: str, message: str | None = None) -> None:
        self.key = key
        self.owner = owner
        if message is None:
            message = f"lock {key!r} held by {owner!r} was lost while its body ran"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[LockLostError], tuple[str, str, str]]:
        return (type(self), (self.key, self.owner, str(self)))


class InboxFullError(AsynclockError):
    """``EventDispatcher.accept`` refused an event: its key holds ``max_pending`` undrained ones.

    Nothing already accepted is dropped; the refused event is not stored. A webhook endpoint
    answers the platform with a non-2xx and ``Retry-After: retry_after`` so it redelivers later.

    Attributes:
        key: the lock key whose inbox is full.
        retry_after: seconds after which a retry is likely to find room (an estimate).

    Example:
        >>> from asynclock import InboxFullError
        >>> error = InboxFullError("slack:C1:T1", 2.5)
        >>> error.key, error.retry_after
        ('slack:C1:T1', 2.5)
    """

    def __init__(self, key: str, retry_after: float, message: str | None = None) -> None:
        self.key = key
        self.retry_after = retry_after
        if message is None:
            message = f"inbox of {key!r} is full; retry after {retry_after:.1f} s"
        super().__init__(message)

    def __reduce__(self) -> tuple[type[InboxFullError], tuple[str, float, str]]:
        return (type(self), (self.key, self.retry_after, str(self)))


class StateError(AsynclockError):
    """A state backend failed (base class)."""


class StateUnavailableError(StateError, ConnectionError):
    """The state backend could not be reached, or did not answer within its timeout.

    The driver's own exception is chained as ``__cause__``. Messages never contain passwords.

    Example:
        It is also a ``ConnectionError``, so code that handles those keeps working:

        >>> from asynclock import StateError, StateUnavailableError
        >>> issubclass(StateUnavailableError, StateError), issubclass(
        ...     StateUnavailableError, ConnectionError)
        (True, True)
    """
