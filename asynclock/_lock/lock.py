"""AsyncLock: a TTL lock with fencing tokens, FIFO wake-ups and cancellation safety.

The public face only: every acquisition runs in the lock's engine,
:class:`~asynclock._lock.acquisition.Acquisition` (``acquisition.py``: waiting for a turn and
contending; its base in ``engine.py``: the line, a place in it, one try, holding, release, a
loss). The dispatcher, the inbox and the event claims use that engine directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, final

from asynclock._lock.acquisition import Acquisition
from asynclock._validate import check_key, check_seconds, check_ttl

if TYPE_CHECKING:
    from collections.abc import Awaitable
    from types import TracebackType

    from asynclock.state._protocol import State


@final
class AsyncLock:
    """A distributed TTL lock for asyncio, held by one task at a time.

    Create one object per acquisition (``async with AsyncLock(state, key):``), like a
    ``with open(...)``; the object belongs to the task that acquired it.

    Invariants:

    * **Single owner, not reentrant.** Entering a lock object that is held (or being acquired)
      raises ``RuntimeError``; so does releasing it from a task other than the one that
      acquired it.
    * **Expiry by the server's clock.** Without ``auto_renew`` a holder keeps the lock for at
      most ``ttl`` seconds from its last acquire/extend; after that anyone may take it.
    * **Fencing.** Every acquisition gets a token strictly greater than every earlier token of
      the key. Hand it to the store you write to, and let the store reject writes with a token
      lower than one it has seen (see the timeline below).
    * **Owner ids are per acquisition** (``"<host>:<pid>:<task id>:<random>"``), never shared
      between tasks.
    * **Waiters are served in arrival order within a process**, and they do not poll: they wake
      on the release (pub/sub, in-process events) or when the holder's TTL runs out.
    * **Cancellation.** A task cancelled while acquiring leaves no lock behind: if the server
      granted it just as the cancellation came, it is released (or handed to the next waiter)
      at once. A cancelled release still completes in the background. A task that ends while
      still holding a lock (say it was cancelled between ``acquire()`` and ``release()``
      without a ``try``/``finally``) has it released for it, with a warning.

    Timeline (why fencing tokens matter)::

        t=0   A acquires "invoice:7" (ttl=10)          token 41
        t=3   A stalls (GC pause, slow network) ...
        t=10  A's lock expires on the server
        t=11  B acquires "invoice:7"                   token 42
        t=12  B writes to the store with token 42      store remembers 42
        t=13  A wakes up and writes with token 41      store rejects: 41 < 42
        t=13  A's release raises LockNotOwnedError

    Args:
        state: where the lock lives (:class:`MemoryState`, :class:`RedisState`, ...).
        key: the lock's name; any non-empty string.
        ttl: seconds the lock lives unless released or extended.
        blocking: whether ``acquire()`` (and ``async with``) waits for a held lock.
        timeout: seconds a blocking acquire waits at most (``None``: no limit).
        auto_renew: extend the lock every ``ttl/3`` while held; if it is lost, cancel the body
            and raise :class:`LockLostError` from ``async with``.
        max_lifetime: with ``auto_renew``, stop renewing after this many seconds of holding;
            the body is then cancelled with :class:`LockLostError` as well.

    Example:
        >>> import asyncio, asynclock
        >>> async def main():
        ...     state = asynclock.MemoryState()
        ...     async with asynclock.AsyncLock(state, "contact:42", ttl=5.0) as lock:
        ...         return lock.owned, lock.token > 0
        >>> asyncio.run(main())
        (True, True)
    """

    __slots__ = ("__weakref__", "_engine")

    def __init__(
        self,
        state: State,
        key: str,
        ttl: float = 30.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_renew: bool = False,
        max_lifetime: float | None = None,
    ) -> None:
        key = check_key(key)
        ttl = check_ttl(ttl, key=key)
        if timeout is not None:
            timeout = check_seconds(timeout, "timeout", key=key, allow_zero=True)
        if max_lifetime is not None:
            max_lifetime = check_seconds(max_lifetime, "max_lifetime", key=key)
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, got {blocking!r} (key {key!r})")
        self._engine = Acquisition(
            state, key, ttl, blocking, timeout, bool(auto_renew), max_lifetime
        )

    # -- read-only views ----------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The lock's key."""
        return self._engine.key

    @property
    def ttl(self) -> float:
        """Seconds the lock lives unless released or extended."""
        return self._engine.ttl

    @property
    def state(self) -> State:
        """The state the lock lives in."""
        return self._engine.state

    @property
    def owned(self) -> bool:
        """Whether this object acquired the lock and has not released it (a local view)."""
        return self._engine.token is not None

    @property
    def owner(self) -> str:
        """The owner id of the current (or last) acquisition; ``""`` before the first."""
        return self._engine.owner

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) acquisition; ``None`` before the first."""
        engine = self._engine
        return engine.token if engine.token is not None else engine.last_token

    @property
    def granted(self) -> bool:
        """Whether this object was entered *without* acquiring (see ``process_without_lock``).

        Inside a call that :func:`retry_on_lock_conflict` runs with
        ``on_exhaustion="process_without_lock"``, every lock is granted at once without touching
        the state: ``acquire()`` returns ``True`` while ``owned`` stays ``False``, and
        ``release()``/``extend()`` do nothing.
        """
        return self._engine.granted

    @property
    def lost(self) -> bool:
        """Whether the lock was found lost while held (auto-renew, extend or release)."""
        return self._engine.lost

    @property
    def retry_after(self) -> float | None:
        """After a failed acquire: seconds until the holder's lock expires, if known."""
        return self._engine.retry_after

    def __repr__(self) -> str:
        engine = self._engine
        status = "owned" if engine.token is not None else ("lost" if engine.lost else "unlocked")
        token = f" token={engine.token}" if engine.token is not None else ""
        return f"<AsyncLock {engine.key!r} {status}{token} ttl={engine.ttl} state={engine.state!r}>"

    # -- acquire, release, extend -------------------------------------------------------------

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Acquire the lock.

        Args:
            blocking: wait for a held lock (default: the constructor's ``blocking``).
            timeout: seconds to wait at most (default: the constructor's ``timeout``).

        Returns:
            ``True`` once acquired. ``False`` only for a non-blocking attempt that found the
            lock held (it never raises on conflict).

        Raises:
            LockAcquisitionError: a blocking acquire ran out of ``timeout``.
            RuntimeError: this object is already held or being acquired (not reentrant).
            StateUnavailableError: the backend could not be reached.
        """
        return await self._engine.acquire(blocking, timeout)

    async def release(self) -> None:
        """Release the lock (or hand it to the next waiter of this process).

        Raises:
            LockNotOwnedError: the lock had expired or been taken over before the release.
            RuntimeError: this object does not hold the lock, or another task acquired it.
            StateUnavailableError: the backend could not be reached (the lock then expires by
                its TTL; ``owned`` stays ``True`` so the release can be retried).
        """
        await self._engine.release()

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lock's TTL to ``ttl`` seconds from now (default: the lock's ``ttl``).

        Raises:
            LockNotOwnedError: the lock had expired or been taken over; it is not re-created.
            RuntimeError: this object does not hold the lock.
        """
        await self._engine.extend(ttl)

    async def locked(self) -> bool:
        """Whether anyone (this object included) holds the lock right now, per the server."""
        engine = self._engine
        return await engine.state.inspect(engine.key) is not None

    # -- async with ---------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncLock:
        engine = self._engine
        await engine.acquire()  # raises LockAcquisitionError when a timeout runs out
        engine.entered()
        return self

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[None]:
        # the engine's coroutine itself, awaited by `async with`: no coroutine of our own
        return self._engine.exit(exc_type, exc)
