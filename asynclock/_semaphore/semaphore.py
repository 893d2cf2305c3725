"""Semaphore: at most ``limit`` holders per key across processes, fenced, fair, pushed."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, final

from asynclock._cancel import BodyCanceller, finish_despite_cancellation, run_in_background
from asynclock._errors import (
    LockAcquisitionError,
    LockLostError,
    LockNotOwnedError,
)
from asynclock._lock.engine import Ticket, release_on_exit
from asynclock._lock.grant import granted_reason
from asynclock._lock.renew import Renewer
from asynclock._owner import new_owner
from asynclock._semaphore.capability import semaphore_state
from asynclock._semaphore.contend import take_permit
from asynclock._validate import check_key, check_permits, check_seconds, check_ttl

if TYPE_CHECKING:
    from types import TracebackType

    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")


@final
class Semaphore:
    """A distributed counting semaphore: at most ``limit`` holders of ``key`` at any time.

    The N-at-a-time sibling of :class:`AsyncLock`, with its surface, errors and guarantees
    (``limit=1`` behaves like a lock). Create one object per acquisition, like a lock; the
    object belongs to the task that acquired its permit.

    Invariants:

    * **At most ``limit`` permits** of one key are held at once, by every task of every
      process sharing the state (memory: of the process); a permit is one acquisition.
    * **Expiry by the server's clock.** A permit lives ``ttl`` seconds from its last
      acquire/extend unless released, so a dead holder's permit frees after its TTL; with
      ``auto_renew`` a live holder keeps it, and a lost permit cancels the body.
    * **Fencing.** Every permit gets a token strictly greater than every earlier token of the
      key (all permits of a key share one sequence).
    * **Waiters are served oldest first, across processes**, in one queue per key kept by the
      state; a newcomer's try never overtakes a waiter. Waiters are woken by the release that
      made them eligible (push), never by polling; a waiter that died keeps its place at most
      ``PLACE_HOLD`` (5) seconds.
    * **Owner ids are per acquisition**, never shared between tasks; not reentrant.
    * **Cancellation.** A task cancelled while acquiring leaves no permit and no place behind;
      a cancelled release completes; a task that ends holding a permit has it released, with
      a warning.

    Timeline (``limit=2``, why every permit has its own token)::

        t=0   A takes a permit of "tenant:42" (ttl=10)      token 41
        t=1   B takes the second permit                      token 42
        t=2   C waits (queue: C)
        t=3   A stalls (GC pause) ...
        t=10  A's permit expires; C is next in line          token 43
        t=12  A wakes, writes with token 41: the store rejects 41 < 43 for this resource

    Args:
        state: where the permits live (a state with the ``SemaphoreState`` capability: every
            built-in one).
        key: the semaphore's name; any non-empty string (a namespace apart from lock keys).
        limit: the most holders at once (an int >= 1). Every user of a key should pass the
            same limit; a caller with a smaller one waits until the count is below its own.
        ttl: seconds a permit lives unless released or extended.
        blocking: whether ``acquire()`` (and ``async with``) waits for a permit.
        timeout: seconds a blocking acquire waits at most (``None``: no limit).
        auto_renew: extend the permit every ``ttl/3`` while held; if it is lost, cancel the body
            and raise :class:`LockLostError` from ``async with``.
        max_lifetime: with ``auto_renew``, stop renewing after this many seconds of holding.

    Raises:
        ValueError: ``limit < 1``, ``ttl <= 0``, an empty key, ``timeout < 0``.
        TypeError: a state without the semaphore capability, or arguments of the wrong type.

    Example:
        >>> import asyncio, asynclock
        >>> async def main():
        ...     state = asynclock.MemoryState()
        ...     async with asynclock.Semaphore(state, "tenant:42", limit=2) as a:
        ...         async with asynclock.Semaphore(state, "tenant:42", limit=2) as b:
        ...             third = asynclock.Semaphore(state, "tenant:42", limit=2)
        ...             return await third.acquire(blocking=False), b.token > a.token
        >>> asyncio.run(main())
        (False, True)
    """

    __slots__ = (
        "_auto_renew",
        "_blocking",
        "_body",
        "_busy",
        "_ended",
        "_granted",
        "_key",
        "_last_token",
        "_limit",
        "_lost",
        "_max_lifetime",
        "_owner",
        "_renewer",
        "_retry_after",
        "_semaphores",
        "_state",
        "_task",
        "_ticket",
        "_timeout",
        "_token",
        "_ttl",
    )

    def __init__(
        self,
        state: State,
        key: str,
        limit: int,
        ttl: float = 30.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        auto_renew: bool = False,
        max_lifetime: float | None = None,
    ) -> None:
        key = check_key(key)
        self._limit = check_permits(limit, key=key)
        self._ttl = check_ttl(ttl, key=key)
        if timeout is not None:
            timeout = check_seconds(timeout, "timeout", key=key, allow_zero=True)
        if max_lifetime is not None:
            max_lifetime = check_seconds(max_lifetime, "max_lifetime", key=key)
        if not isinstance(blocking, bool):
            raise TypeError(f"blocking must be a bool, got {blocking!r} (key {key!r})")
        self._semaphores = semaphore_state(state)
        self._state = state
        self._key = key
        self._blocking = blocking
        self._timeout = timeout
        self._auto_renew = bool(auto_renew)
        self._max_lifetime = max_lifetime
        self._owner = ""
        self._token: int | None = None
        self._last_token: int | None = None
        self._ticket: Ticket | None = None
        self._task: asyncio.Task[object] | None = None
        self._ended = self._task_ended  # one bound method: added and removed as a done callback
        self._busy = self._granted = self._lost = False
        self._retry_after: float | None = None
        self._renewer: Renewer | None = None
        self._body: BodyCanceller | None = None

    # -- read-only views ----------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The semaphore's key."""
        return self._key

    @property
    def limit(self) -> int:
        """The most holders of the key at once."""
        return self._limit

    @property
    def ttl(self) -> float:
        """Seconds a permit lives unless released or extended."""
        return self._ttl

    @property
    def state(self) -> State:
        """The state the permits live in."""
        return self._state

    @property
    def owned(self) -> bool:
        """Whether this object holds a permit it has not released (a local view)."""
        return self._token is not None

    @property
    def owner(self) -> str:
        """The owner id of the current (or last) acquisition; ``""`` before the first."""
        return self._owner

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) permit; ``None`` before the first."""
        return self._token if self._token is not None else self._last_token

    @property
    def granted(self) -> bool:
        """Whether this object was entered *without* acquiring (``process_without_lock``)."""
        return self._granted

    @property
    def lost(self) -> bool:
        """Whether the permit was found lost while held (auto-renew, extend or release)."""
        return self._lost

    @property
    def retry_after(self) -> float | None:
        """After a failed acquire: seconds until the first permit (or a place ahead) expires."""
        return self._retry_after

    def __repr__(self) -> str:
        status = "owned" if self.owned else ("lost" if self._lost else "unlocked")
        token = f" token={self._token}" if self._token is not None else ""
        return (
            f"<Semaphore {self._key!r} limit={self._limit} {status}{token} ttl={self._ttl} "
            f"state={self._state!r}>"
        )

    # -- acquire ------------------------------------------------------------------------------

    async def acquire(self, blocking: bool | None = None, timeout: float | None = None) -> bool:
        """Take a permit, waiting in turn (oldest first) when none is free.

        Args:
            blocking: wait for a permit (default: the constructor's ``blocking``).
            timeout: seconds to wait at most (default: the constructor's ``timeout``).

        Returns:
            ``True`` once a permit is held. ``False`` only for a non-blocking attempt that found
            none free in turn (it never raises on conflict).

        Raises:
            LockAcquisitionError: a blocking acquire ran out of ``timeout``.
            RuntimeError: this object holds a permit or is acquiring one (not reentrant).
            StateUnavailableError: the backend could not be reached.
        """
        if blocking is None:
            blocking = self._blocking
        if timeout is None:
            timeout = self._timeout
        else:
            timeout = check_seconds(timeout, "timeout", key=self._key, allow_zero=True)
        if self._busy or self._token is not None or self._granted:
            raise RuntimeError(
                f"Semaphore {self._key!r} is already held or being acquired by this object; "
                "it is not reentrant: create one Semaphore per acquisition"
            )
        reason = granted_reason()
        if reason is not None:
            await asyncio.sleep(0)  # the yield rule holds here too
            self._granted = True
            logger.debug(
                "asynclock: semaphore %r granted without acquiring (%s)", self._key, reason
            )
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if blocking and timeout is not None else None
        task = asyncio.current_task()
        owner = new_owner(task)
        self._owner, self._lost, self._retry_after = owner, False, None
        self._busy = True
        try:
            grant, sent = await take_permit(
                self._semaphores,
                self._key,
                owner,
                self._limit,
                self._ttl,
                blocking=bool(blocking),
                deadline=deadline,
            )
        finally:
            self._busy = False
        if grant.token is not None:
            self._won(grant.token, sent, task)
            return True
        self._retry_after = grant.retry_after
        if not blocking:
            return False
        raise self._conflict()

    def _conflict(self) -> LockAcquisitionError:
        after = self._retry_after
        when = f"the first permit expires in {after:.3f} s" if after is not None else "unknown"
        return LockAcquisitionError(
            self._key,
            self._ttl,
            after,
            f"could not acquire a permit of semaphore {self._key!r}: all {self._limit} are "
            f"held or promised to earlier waiters ({when})",
        )

    def _won(self, token: int, sent: float, task: asyncio.Task[object] | None) -> None:
        ticket = Ticket(self._owner, self._ttl)
        ticket.expires = sent + self._ttl  # the server started the TTL after we sent
        self._ticket = ticket
        self._token = token
        self._task = task
        if task is not None:
            task.add_done_callback(self._ended)

    def _task_ended(self, task: asyncio.Task[object]) -> None:
        """The acquiring task ended while holding the permit: nobody can release it now."""
        if self._token is None:
            return
        logger.warning(
            "asynclock: task %r ended while holding a permit of semaphore %r without "
            "releasing it; releasing it",
            task.get_name(),
            self._key,
            extra={"lock_key": self._key, "owner": self._owner},
        )
        self._stop_renewing()
        owner = self._owner
        self._forget()
        run_in_background(self._semaphores.semaphore_release(self._key, owner))

    # -- release and extend -------------------------------------------------------------------

    async def release(self) -> None:
        """Give the permit back, waking the waiter it makes eligible.

        Raises:
            LockNotOwnedError: the permit had expired before the release.
            RuntimeError: this object holds no permit, or another task acquired it.
            StateUnavailableError: the backend could not be reached (the permit then expires by
                its TTL; ``owned`` stays ``True`` so the release can be retried).
        """
        if self._granted:
            self._granted = False
            await asyncio.sleep(0)
            return
        if self._token is None:
            raise RuntimeError(f"cannot release Semaphore {self._key!r}: it is not held")
        if self._task is not None and asyncio.current_task() is not self._task:
            raise RuntimeError(
                f"cannot release Semaphore {self._key!r} from a task that did not acquire it"
            )
        await self._release()

    async def _release(self) -> None:
        self._stop_renewing()
        owner = self._owner
        try:
            owned = await self._semaphores.semaphore_release(self._key, owner)
        except asyncio.CancelledError:
            # The release may not have landed: finish it before the cancellation goes on (a
            # second release of a permit already given back changes nothing).
            self._forget()
            await finish_despite_cancellation(self._semaphores.semaphore_release(self._key, owner))
            raise
        self._forget()
        if not owned:
            self._lost = True
            raise LockNotOwnedError(
                self._key,
                owner,
                f"semaphore {self._key!r}: the permit of {owner!r} had expired before its "
                "release (its TTL ran out), and another acquirer may hold it now",
            )

    def _forget(self) -> None:
        """The permit is given back (or gone): keep its token as the last, stop tracking."""
        self._last_token, self._token = self._token, None
        task, self._task = self._task, None
        if task is not None:
            task.remove_done_callback(self._ended)

    def _stop_renewing(self) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the permit's TTL to ``ttl`` seconds from now (default: the semaphore's ``ttl``).

        Raises:
            LockNotOwnedError: the permit had expired; it is not re-created.
            RuntimeError: this object holds no permit.
        """
        new_ttl = self._ttl if ttl is None else check_ttl(ttl, key=self._key)
        if self._granted:
            await asyncio.sleep(0)
            return
        ticket = self._ticket
        if self._token is None or ticket is None:
            raise RuntimeError(f"cannot extend Semaphore {self._key!r}: it is not held")
        started = asyncio.get_running_loop().time()
        if not await self._semaphores.semaphore_extend(self._key, self._owner, new_ttl):
            self._lost = True
            raise LockNotOwnedError(self._key, self._owner)
        ticket.expires = started + new_ttl

    async def locked(self) -> bool:
        """Whether a permit could not be taken at once: ``limit`` are held or promised to
        waiters (as ``asyncio.Semaphore.locked``). Asks the server; one read."""
        info = await self._semaphores.semaphore_inspect(self._key)
        return len(info.holders) + info.waiting >= self._limit

    # -- async with ---------------------------------------------------------------------------

    async def __aenter__(self) -> Semaphore:
        await self.acquire()  # raises LockAcquisitionError when a timeout runs out
        if self._granted:
            return self
        if not self.owned:
            raise self._conflict()
        if self._auto_renew:
            self._body = BodyCanceller()
            assert self._ticket is not None
            self._renewer = Renewer(
                self._state,
                self._key,
                self._ticket,
                self._ttl,
                self._max_lifetime,
                self._on_lost,
                extend=self._semaphores.semaphore_extend,
            )
        return self

    def _on_lost(self, reason: str) -> None:
        self._lost = True
        logger.warning(
            "asynclock: permit of semaphore %r lost while held (%s); cancelling its body",
            self._key,
            reason,
            extra={"lock_key": self._key, "owner": self._owner},
        )
        if self._body is not None:
            self._body.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._granted:
            self._granted = False
            return
        lost_while_held = self._lost  # set by the renewer; release() sets it too, later
        self._stop_renewing()
        # stop cancelling the body before awaiting anything: the release must not be cancelled
        body, self._body = self._body, None
        swallowed = body.leave(exc_type) if body is not None else False
        if self._token is not None:
            await release_on_exit(
                self._release,
                self._forget,
                what="permit of semaphore",
                key=self._key,
                owner=self._owner,
                body_failed=exc is not None,
                lost_while_held=lost_while_held,
            )
        if lost_while_held and (swallowed or exc is None):
            raise LockLostError(self._key, self._owner) from exc
