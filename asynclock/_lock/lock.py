"""AsyncLock: a TTL lock with fencing tokens, FIFO wake-ups and cancellation safety.

Size: one class, over 500 lines on purpose. Its acquire, place-keeping, release and
``async with`` paths share the acquisition's invariants (one owner per acquisition, the line's
member, what a cancellation leaves behind at every await); kept in one file they can be read
against each other. The waiter line itself lives in ``_lock/waiters.py``, renewal in ``_lock/renew.py``,
cancellation helpers in ``_cancel.py``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
import threading
import weakref
from functools import partial
from typing import TYPE_CHECKING, final

from asynclock import metrics as _metrics
from asynclock._cancel import BodyCanceller, finish_despite_cancellation, run_in_background
from asynclock._errors import (
    LockAcquisitionError,
    LockLostError,
    LockNotOwnedError,
)
from asynclock._lock.grant import granted_reason
from asynclock._lock.leave import release_on_exit
from asynclock._lock.renew import Renewer
from asynclock._lock.turn import current_turn
from asynclock._lock.waiters import (
    Line,
    Ticket,
    line_for,
    release_chain,
    release_now,
    wait_for_turn,
)
from asynclock._owner import new_owner
from asynclock._validate import check_key, check_seconds, check_ttl
from asynclock.metrics._active import active
from asynclock.state._immediate import immediate_steps
from asynclock.state._protocol import Grant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from asynclock._lock.waiters import ReleaseNow, ReleaseStep
    from asynclock.state._protocol import Release, State

logger = logging.getLogger("asynclock")

_NOT_GRANTED = Grant(None, None)

# A waiter re-checks a holder that should have expired this long after its expected expiry;
# covers the small gap between the client's estimate and the server's clock.
_EXPIRY_GRACE = 0.005
# Never re-ask the server sooner than this after it said the holder's lock expires "now".
_MIN_WAIT = 0.001


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

    __slots__ = (
        "__weakref__",
        "_auto_renew",
        "_blocking",
        "_body",
        "_busy",
        "_contended",
        "_first_attempt",
        "_first_attempt_now",
        "_granted",
        "_held_since",
        "_key",
        "_last_token",
        "_lean",
        "_line",
        "_lost",
        "_max_lifetime",
        "_owner",
        "_placed",
        "_refused",
        "_release_with",
        "_renewer",
        "_retry_after",
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
        self._setup(state, key, ttl, blocking, timeout, bool(auto_renew), max_lifetime)

    @classmethod
    def _ttl_checked(cls, state: State, key: str, ttl: float, *, auto_renew: bool) -> AsyncLock:
        """A blocking lock without timeout, for a ``ttl`` the caller has checked already.

        For the dispatcher, which checks its ``lock_ttl`` once and makes one lock per event.
        """
        lock = cls.__new__(cls)
        lock._setup(state, check_key(key), ttl, True, None, auto_renew, None)
        return lock

    def _setup(
        self,
        state: State,
        key: str,
        ttl: float,
        blocking: bool,
        timeout: float | None,
        auto_renew: bool,
        max_lifetime: float | None,
    ) -> None:
        self._key = key
        self._ttl = ttl
        self._timeout = timeout
        self._max_lifetime = max_lifetime
        self._state = state
        # the lean path (docs/decisions.md): a state whose steps need no await (MemoryState),
        # so the lock yields once itself and acts at once
        self._lean = immediate_steps(state)
        self._blocking = blocking
        self._auto_renew = auto_renew
        self._owner = ""
        self._token: int | None = None
        self._ticket: Ticket | None = None
        self._line: Line | None = None
        self._task: asyncio.Task[object] | None = None
        self._busy = False
        self._contended = False
        self._held_since = 0.0
        self._granted = False
        self._placed = False
        self._refused = False
        self._first_attempt: Callable[[str], Awaitable[Grant | None]] | None = None
        self._first_attempt_now: Callable[[str], Grant | None] | None = None
        self._release_with: ReleaseStep | None = None
        self._last_token: int | None = None
        self._lost = False
        self._retry_after: float | None = None
        self._renewer: Renewer | None = None
        self._body: BodyCanceller | None = None

    # -- read-only views ----------------------------------------------------------------------

    @property
    def key(self) -> str:
        """The lock's key."""
        return self._key

    @property
    def ttl(self) -> float:
        """Seconds the lock lives unless released or extended."""
        return self._ttl

    @property
    def state(self) -> State:
        """The state the lock lives in."""
        return self._state

    @property
    def owned(self) -> bool:
        """Whether this object acquired the lock and has not released it (a local view)."""
        return self._token is not None

    @property
    def owner(self) -> str:
        """The owner id of the current (or last) acquisition; ``""`` before the first."""
        return self._owner

    @property
    def token(self) -> int | None:
        """The fencing token of the current (or last) acquisition; ``None`` before the first."""
        return self._token if self._token is not None else self._last_token

    @property
    def granted(self) -> bool:
        """Whether this object was entered *without* acquiring (see ``process_without_lock``).

        Inside a call that :func:`retry_on_lock_conflict` runs with
        ``on_exhaustion="process_without_lock"``, every lock is granted at once without touching
        the state: ``acquire()`` returns ``True`` while ``owned`` stays ``False``, and
        ``release()``/``extend()`` do nothing.
        """
        return self._granted

    @property
    def lost(self) -> bool:
        """Whether the lock was found lost while held (auto-renew, extend or release)."""
        return self._lost

    @property
    def retry_after(self) -> float | None:
        """After a failed acquire: seconds until the holder's lock expires, if known."""
        return self._retry_after

    def __repr__(self) -> str:
        status = "owned" if self.owned else ("lost" if self._lost else "unlocked")
        token = f" token={self._token}" if self._token is not None else ""
        return f"<AsyncLock {self._key!r} {status}{token} ttl={self._ttl} state={self._state!r}>"

    # -- acquire ------------------------------------------------------------------------------

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
        if blocking is None:
            blocking = self._blocking
        if timeout is None:
            timeout = self._timeout
        else:
            timeout = check_seconds(timeout, "timeout", key=self._key, allow_zero=True)
        if self._busy or self._token is not None or self._granted:
            raise RuntimeError(
                f"AsyncLock {self._key!r} is already held or being acquired by this object; "
                "locks are not reentrant: create one AsyncLock per acquisition"
            )
        reason = granted_reason()
        if reason is not None:
            await asyncio.sleep(0)  # the yield rule holds here too
            self._granted = True
            logger.debug("asynclock: lock %r granted without acquiring (%s)", self._key, reason)
            return True
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + timeout if blocking and timeout is not None else None
        self._busy = True
        self._contended = False
        try:
            task = asyncio.current_task()
            line, ticket = self._new_ticket(task)
            lean = self._lean
            if (
                line.member is None
                and lean is not None
                and self._first_attempt is None
                and current_turn() is None
                and lean.steps_are_own()
            ):
                # the lean path: the line's member at once, one yield, one step
                line.member = ticket
                ticket.asked_at = started
                try:
                    await asyncio.sleep(0)  # the yield rule; nothing was asked of the state yet
                except BaseException:
                    line.leave(ticket)
                    raise
                token = lean.token_now(self._key, ticket.owner, self._ttl)
                if token is not None:
                    acquired = self._won(line, ticket, token, task=task)
                else:  # busy: held from elsewhere (another thread's loop, a direct state call)
                    acquired = await self._contend(line, ticket, bool(blocking), deadline)
            else:
                acquired = await self._acquire(line, ticket, bool(blocking), deadline)
        finally:
            self._busy = False
        if active.sink is not None:
            self._report(acquired, started)
        if acquired or not blocking:
            return acquired
        raise LockAcquisitionError(self._key, self._ttl, self._retry_after)

    def _report(self, acquired: bool, started: float) -> None:
        if active.sink is not None:
            if acquired:
                waited = asyncio.get_running_loop().time() - started
                _metrics.report("lock_acquired", self._key, waited, self._contended)
            else:
                _metrics.report("lock_conflict", self._key)

    def _new_ticket(self, task: asyncio.Task[object] | None = None) -> tuple[Line, Ticket]:
        """A fresh acquisition: a new owner id and its ticket in this process's line for the key.

        ``task``: the current task, when the caller has it at hand already.
        """
        line, ticket = line_for(self._state, self._key), Ticket(new_owner(task), self._ttl)
        self._use_ticket(line, ticket)
        return line, ticket

    def _use_ticket(self, line: Line, ticket: Ticket) -> None:
        self._owner = ticket.owner
        self._lost = False
        self._refused = False
        self._retry_after = None
        self._ticket, self._line = ticket, line

    async def _acquire(
        self, line: Line, ticket: Ticket, blocking: bool, deadline: float | None
    ) -> bool:
        """The general path of :meth:`acquire` for the fresh ``ticket`` in ``line``."""
        if line.member is None:
            line.member = ticket
            return await self._contend(line, ticket, blocking, deadline)
        if not blocking:
            # a local holder: one try at the server anyway, which also takes over a lock whose
            # holder let it expire
            grant = await self._attempt(line, ticket, waiting=False)
            if grant.token is not None:
                return self._won(line, ticket, grant.token)
            self._retry_after = grant.retry_after
            return False
        return await self._queue(line, ticket, deadline)

    async def _queue(self, line: Line, ticket: Ticket, deadline: float | None) -> bool:
        """Wait in the line until the lock is handed over, or it is our turn to contend."""
        _join(line, ticket)
        return await self._wait_in_line(line, ticket, deadline)

    async def _wait_in_line(self, line: Line, ticket: Ticket, deadline: float | None) -> bool:
        """As a waiter of ``line``: wait to be handed the lock, or for our turn to contend."""
        loop = asyncio.get_running_loop()
        self._contended = True
        future = ticket.future
        assert future is not None
        while True:
            member = line.member
            bound = member.expires + _EXPIRY_GRACE if member is not None else math.inf
            if deadline is not None:
                bound = min(bound, deadline)
            try:
                await wait_for_turn(future, bound)
            except asyncio.CancelledError:
                await self._abandon_waiting(line, ticket)
                raise
            if future.done():
                result = future.result()
                if result is not None:
                    return self._won(line, ticket, result, handed=True)
                return await self._contend(line, ticket, True, deadline)
            if ticket not in line.waiters:
                # popped by a release that is handing the lock to us right now: its answer
                # comes within the backend's operation timeout, so wait for it, even past
                # the deadline (giving up now would leave the lock to nobody)
                continue
            if deadline is not None and loop.time() >= deadline:
                future.cancel()
                line.drop_waiter(ticket)
                self._retry_after = _left_to(line.member, loop.time())
                return False
            # the holder should have expired by now without releasing: the head of the line
            # takes over and contends on the server (the others keep waiting)
            holder_gone = member is None or loop.time() >= member.expires
            if holder_gone and line.member is member and line.waiters[0] is ticket:
                line.waiters.popleft()
                future.cancel()
                line.member = ticket
                return await self._contend(line, ticket, True, deadline)

    async def _abandon_waiting(self, line: Line, ticket: Ticket) -> None:
        """A waiter was cancelled: leave the line, passing on whatever it was just given.

        A lock handed over just before the cancellation is passed on (or released) before the
        cancellation goes on, so the key is never left to a task that is gone.
        """
        future = ticket.future
        if future is None or not future.done() or future.cancelled():
            if future is not None:
                future.cancel()
            line.drop_waiter(ticket)
            return
        token = future.result()
        if token is None:
            # Promoted to contend, maybe after a handoff of unknown outcome: make sure this
            # owner holds nothing before the next waiter goes.
            try:
                await finish_despite_cancellation(self._state.abandon(self._key, ticket.owner))
            finally:
                line.leave(ticket)
        else:
            await finish_despite_cancellation(release_chain(self._state, line, ticket))

    async def _contend(
        self,
        line: Line,
        ticket: Ticket,
        blocking: bool,
        deadline: float | None,
        *,
        keep_place: bool = False,
    ) -> bool:
        """As the line's member, take the lock from the server (waiting for releases).

        With ``keep_place``, a non-blocking attempt that finds the key busy leaves ``ticket``
        the line's member (see :meth:`_take_place`).
        """
        won = flagged = kept = False
        try:
            grant = await self._attempt(line, ticket, waiting=False)
            if grant.token is not None:
                won = True
                return self._won(line, ticket, grant.token)
            if not blocking:
                self._retry_after = grant.retry_after
                kept = keep_place and not self._refused
                return False
            loop = asyncio.get_running_loop()
            self._contended = True
            async with self._state.watch(self._key) as watch:
                while True:
                    watch.reset()
                    flagged = True
                    grant = await self._attempt(line, ticket, waiting=True)
                    if grant.token is not None:
                        won = True
                        return self._won(line, ticket, grant.token)
                    self._retry_after = grant.retry_after
                    wait = max(grant.retry_after or 0.0, _MIN_WAIT)
                    if deadline is not None:
                        left = deadline - loop.time()
                        if left <= 0:
                            return False
                        wait = min(wait, left)
                    await watch.wait(wait)
        finally:
            if not won and not kept:
                line.leave(ticket)
                if flagged and line.member is None:
                    # nobody of this process waits for the key any more: withdraw our flag or
                    # reservation, so other processes are not kept waiting for us
                    withdraw = self._state.abandon(self._key, ticket.owner)
                    if sys.exc_info()[0] is asyncio.CancelledError:
                        await finish_despite_cancellation(withdraw)
                    else:
                        run_in_background(withdraw)

    def _arm_first_attempt(
        self,
        attempt: Callable[[str], Awaitable[Grant | None]],
        now: Callable[[str], Grant | None] | None = None,
    ) -> None:
        """Send ``attempt(owner)`` instead of the state's acquire for the next first try.

        For callers that fold more work into the acquire's atomic step (the dispatcher records
        an event's dedupe claim in it: one round trip per fresh event). ``attempt`` answers like
        ``State.acquire``, or ``None`` to refuse: the lock is then not acquired and
        :attr:`_refused` is set. Used once, and only if this acquisition does reach the server.
        ``now``: the same step without an await, used instead on the lean path.
        """
        self._first_attempt = attempt
        self._first_attempt_now = now

    def _arm_release(self, release: ReleaseStep, now: ReleaseNow | None = None) -> bool:
        """Send ``release(key, owner, successor, ttl)`` instead of the state's release, once.

        The counterpart of :meth:`_arm_first_attempt` (the dispatcher marks a handled event's
        claim done in the release). ``False`` when the lock is not held through the state
        (granted): nothing will be released, and the caller does its work itself. ``now``:
        the same step without an await, for the lean path.
        """
        ticket = self._ticket
        if self._token is None or ticket is None:
            return False
        ticket.release_with = release
        ticket.release_now = now
        return True

    # -- a place in the line, kept across the caller's awaits (for the dispatcher) ------------

    def _take_place(self) -> None:
        """Join this process's line for the key now, without asking the server and without awaiting.

        The dispatcher's arrival-order guarantee rests on this: an event takes its place the
        moment it arrives, so nothing it awaits next (a dedupe check, a conflict policy) lets a
        later event of the same key overtake it. Exactly one of :meth:`_try_from_place` (then,
        if it returned ``False``, :meth:`_wait_turn` or :meth:`_leave_place`) or
        :meth:`_leave_place` must follow.
        """
        if self._busy or self._placed or self._token is not None or self._granted:
            raise RuntimeError(f"AsyncLock {self._key!r} is already held or being acquired")
        line, ticket = self._new_ticket()
        if line.member is None:
            line.member = ticket
        else:
            _join(line, ticket)
        self._placed_at_once()

    def _placed_at_once(self) -> None:
        self._placed = True
        self._contended = False
        self._held_since = asyncio.get_running_loop().time()  # when the place was taken

    def _adopt_place(self, line: Line, ticket: Ticket) -> None:
        """:meth:`_take_place` with ``ticket``, the member of ``line`` already (the dispatcher's
        lean path hands its place over when it found the key busy)."""
        self._use_ticket(line, ticket)
        self._placed_at_once()

    def _adopt_held(
        self, line: Line, ticket: Ticket, token: int, since: float, body: BodyCanceller
    ) -> None:
        """Take over a lock the dispatcher's lean path acquired for ``ticket`` at ``since``, as if
        this object had acquired it and entered ``async with`` with ``body``; renew it from now.

        Only renewal and the release are left to this object (its first renewal is due now).
        """
        self._use_ticket(line, ticket)
        self._token = token
        self._held_since = since
        self._body = body
        self._renewer = Renewer(
            self._state, self._key, ticket, self._ttl, None, self._on_lost, started=since
        )

    def _first_in_line(self) -> bool:
        """Whether the place taken is the line's member (the one that asks the state)."""
        return self._line is not None and self._line.member is self._ticket

    async def _try_from_place(self) -> bool:
        """Acquire without waiting, from the place taken; on ``False`` the place is kept.

        Only the line's member asks the server (one attempt); a waiter behind a member of this
        process answers ``False`` at once, unless the lock was handed to it meanwhile.
        """
        ticket, line = self._ticket, self._line
        assert self._placed
        assert ticket is not None
        assert line is not None
        placed_at = self._held_since
        handed = _handed_token(ticket)
        if handed is not None:
            self._placed = False
            self._contended = True
            self._report(self._won(line, ticket, handed, handed=True), placed_at)
            return True
        if line.member is not ticket:
            self._retry_after = _left_to(line.member, asyncio.get_running_loop().time())
            self._report(False, placed_at)
            return False
        lean = self._lean
        if lean is not None and current_turn() is None and lean.steps_are_own():
            # the lean path: one yield, then the first attempt as one step, without an await
            first, self._first_attempt_now = self._first_attempt_now, None
            self._first_attempt = None
            ticket.asked_at = asyncio.get_running_loop().time()
            self._busy = True
            try:
                await asyncio.sleep(0)  # the yield rule; nothing was asked of the state yet
                if first is None:
                    grant: Grant | None = lean.acquire_now(self._key, ticket.owner, self._ttl)
                else:
                    grant = first(ticket.owner)
            except BaseException:
                self._placed = False
                line.leave(ticket)
                raise
            finally:
                self._busy = False
            if grant is None:  # refused by the armed step
                self._refused = True
                self._placed = False
                line.leave(ticket)
                return False
            if grant.token is not None:
                self._placed = False
                self._report(self._won(line, ticket, grant.token), placed_at)
                return True
            self._retry_after = grant.retry_after  # the place is kept
            self._report(False, placed_at)
            return False
        self._busy = True
        try:
            won = await self._contend(line, ticket, False, None, keep_place=True)
        except BaseException:
            self._placed = False  # _contend left the line
            raise
        finally:
            self._busy = False
        if won or self._refused:
            self._placed = False
        if not self._refused:
            self._report(won, placed_at)
        return won

    async def _wait_turn(self, deadline: float | None) -> bool:
        """Wait from the place kept until the lock is ours (``False``: ``deadline`` passed)."""
        ticket, line = self._ticket, self._line
        assert self._placed
        assert ticket is not None
        assert line is not None
        placed_at = self._held_since
        self._busy = True
        try:
            handed = _handed_token(ticket)
            if handed is not None:
                won = self._won(line, ticket, handed, handed=True)
            elif line.member is ticket:
                won = await self._contend(line, ticket, True, deadline)
            else:
                won = await self._wait_in_line(line, ticket, deadline)
        finally:
            self._placed = False
            self._busy = False
        self._contended = True
        if won:
            self._report(True, placed_at)
        return won

    async def _leave_place(self) -> None:
        """Give the place up, passing on a lock handed over meanwhile. Idempotent."""
        ticket, line = self._ticket, self._line
        if not self._placed or ticket is None or line is None:
            return
        self._placed = False
        if ticket.future is not None:
            await self._abandon_waiting(line, ticket)
        else:  # the member, with nothing on the server: its one attempt found the key busy
            line.leave(ticket)

    def _hold_granted(self, owner: str, token: int, since: float) -> None:
        """Hold the lock the state handed to this task for ``owner`` at loop time ``since``
        (the inbox's hand-out), as if this object had acquired it then.

        ``async with lock._holding()`` follows: it renews the lock on the schedule that began at
        ``since`` and releases it on exit (unless a step of the caller released it first).
        """
        if self._busy or self._placed or self._token is not None or self._granted:
            raise RuntimeError(f"AsyncLock {self._key!r} is already held or being acquired")
        line, ticket = line_for(self._state, self._key), Ticket(owner, self._ttl)
        self._use_ticket(line, ticket)
        if line.member is None:
            line.hold(ticket, self._ttl, since)
        else:  # an acquirer of this process contends at the server: the release wakes it
            ticket.expires = since + self._ttl
        self._won(line, ticket, token, handed=True)
        self._held_since = since

    def _released_by_step(self) -> None:
        """The server released the lock in a step of the caller's (the inbox's release-if-empty).

        Only the local bookkeeping is left: stop renewing, forget the acquisition (so leaving
        ``async with`` sends no release) and let this process's next waiter contend.
        """
        ticket, line = self._ticket, self._line
        if self._token is None or ticket is None or line is None:
            return
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        self._forget_acquisition()
        line.leave(ticket)

    def _holding(self) -> _Holding:
        """``async with`` for a lock acquired (or granted) already: renewal, then release.

        Renewal counts from the acquisition (:meth:`_hold_granted`: from the hand-out).
        """
        self._check_held()
        return _Holding(self)

    def _check_held(self) -> None:
        if self._token is None and not self._granted:
            raise RuntimeError(f"AsyncLock {self._key!r} is not held")

    async def _attempt(self, line: Line, ticket: Ticket, *, waiting: bool) -> Grant:
        """One server acquire. If its outcome is unknown (cancelled, timed out), undo it."""
        ticket.asked_at = asyncio.get_running_loop().time()
        try:
            first = self._first_attempt
            if first is not None and not waiting:
                self._first_attempt = None
                grant = await first(ticket.owner)
                if grant is None:
                    self._refused = True
                    return _NOT_GRANTED
                return grant
            turn = current_turn()
            if turn is not None and not waiting:
                # a fair retry (asynclock._lock.turn): take the key only in first-conflict order
                return await turn.acquire(self._state, self._key, ticket.owner, self._ttl)
            return await self._state.acquire(self._key, ticket.owner, self._ttl, waiting=waiting)
        except asyncio.CancelledError:
            # The server may have granted the lock, or may still if the command is on the
            # wire. Undo it before the cancellation goes on, so the key is free once the task
            # is done (bounded by the backend's operation timeout).
            await finish_despite_cancellation(self._state.abandon(self._key, ticket.owner))
            raise
        except BaseException:
            run_in_background(self._state.abandon(self._key, ticket.owner))
            raise

    def _won(
        self,
        line: Line,
        ticket: Ticket,
        token: int,
        *,
        handed: bool = False,
        task: asyncio.Task[object] | None = None,
    ) -> bool:
        if not handed:  # a handoff was timed by the releaser, when it sent the handoff
            line.hold(ticket, self._ttl, ticket.asked_at)
        self._token = token
        self._held_since = asyncio.get_running_loop().time()
        if task is None:
            task = asyncio.current_task()
        self._task = task
        if task is not None:
            _track(task, self)
        return True

    def _owner_task_ended(self, task: asyncio.Task[object]) -> None:
        """The acquiring task ended while still holding the lock: nobody can release it now."""
        ticket, line = self._ticket, self._line
        if self._token is None or ticket is None or line is None:
            return
        logger.warning(
            "asynclock: task %r ended while holding lock %r without releasing it; releasing it",
            task.get_name(),
            self._key,
            extra={"lock_key": self._key, "owner": ticket.owner},
        )
        self._forget_acquisition()
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        self._spawn_release(line, ticket)

    # -- release ------------------------------------------------------------------------------

    def _spawn_release(self, line: Line, ticket: Ticket) -> None:
        task = asyncio.get_running_loop().create_task(release_chain(self._state, line, ticket))
        task.add_done_callback(_log_background_failure)

    async def release(self) -> None:
        """Release the lock (or hand it to the next waiter of this process).

        Raises:
            LockNotOwnedError: the lock had expired or been taken over before the release.
            RuntimeError: this object does not hold the lock, or another task acquired it.
            StateUnavailableError: the backend could not be reached (the lock then expires by
                its TTL; ``owned`` stays ``True`` so the release can be retried).
        """
        if self._granted:
            self._granted = False
            await asyncio.sleep(0)
            return
        ticket, line = self._ticket, self._line
        if self._token is None or ticket is None or line is None:
            raise RuntimeError(f"cannot release AsyncLock {self._key!r}: it is not held")
        if self._task is not None and asyncio.current_task() is not self._task:
            raise RuntimeError(
                f"cannot release AsyncLock {self._key!r} from a task that did not acquire it"
            )
        await self._release(line, ticket)

    async def _release(self, line: Line, ticket: Ticket) -> None:
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        lean = self._lean
        try:
            if (
                lean is not None
                and (ticket.release_with is None or ticket.release_now)
                and lean.steps_are_own()
            ):
                try:
                    await asyncio.sleep(0)  # the yield rule
                except asyncio.CancelledError:
                    release_now(lean, line, ticket)  # a cancelled release still completes
                    raise
                result = release_now(lean, line, ticket)
            else:
                result = await release_chain(self._state, line, ticket)
        except asyncio.CancelledError:
            self._forget_acquisition()  # release_chain finishes the release in the background
            raise
        self._forget_acquisition()
        if active.sink is not None:
            held = asyncio.get_running_loop().time() - self._held_since
            _metrics.report("lock_released", self._key, held)
        if not result.owned:
            self._lost = True
            raise LockNotOwnedError(self._key, ticket.owner)

    def _forget_acquisition(self) -> None:
        self._last_token = self._token
        self._token = None
        task, self._task = self._task, None
        if task is not None:
            _untrack(task, self)

    # -- extend -------------------------------------------------------------------------------

    async def extend(self, ttl: float | None = None) -> None:
        """Reset the lock's TTL to ``ttl`` seconds from now (default: the lock's ``ttl``).

        Raises:
            LockNotOwnedError: the lock had expired or been taken over; it is not re-created.
            RuntimeError: this object does not hold the lock.
        """
        new_ttl = self._ttl if ttl is None else check_ttl(ttl, key=self._key)
        if self._granted:
            await asyncio.sleep(0)
            return
        ticket, line = self._ticket, self._line
        if self._token is None or ticket is None or line is None:
            raise RuntimeError(f"cannot extend AsyncLock {self._key!r}: it is not held")
        loop = asyncio.get_running_loop()
        started = loop.time()
        if not await self._state.extend(self._key, ticket.owner, new_ttl):
            self._lost = True
            raise LockNotOwnedError(self._key, ticket.owner)
        ticket.expires = started + new_ttl

    async def locked(self) -> bool:
        """Whether anyone (this object included) holds the lock right now, per the server."""
        return await self._state.inspect(self._key) is not None

    # -- async with ---------------------------------------------------------------------------

    async def __aenter__(self) -> AsyncLock:
        await self.acquire()  # raises LockAcquisitionError when a timeout runs out
        if self._granted:
            return self
        if not self.owned:
            raise LockAcquisitionError(self._key, self._ttl, self._retry_after)
        self._start_holding()
        return self

    def _start_holding(self, since: float | None = None) -> None:
        """The body begins: start renewing (``auto_renew``), able to cancel the body.

        ``since``: the loop time the lock's TTL started, when that was before now.
        """
        if self._auto_renew and not self._granted:
            self._body = BodyCanceller()
            assert self._ticket is not None
            self._renewer = Renewer(
                self._state,
                self._key,
                self._ticket,
                self._ttl,
                self._max_lifetime,
                self._on_lost,
                started=since,
            )

    def _on_lost(self, reason: str) -> None:
        self._lost = True
        if active.sink is not None:
            _metrics.report("lock_lost", self._key, reason)
        logger.warning(
            "asynclock: lock %r lost while held (%s); cancelling its body",
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
        if self._renewer is not None:
            self._renewer.stop()
            self._renewer = None
        # Stop cancelling the body before awaiting anything: the release must not be cancelled.
        body, self._body = self._body, None
        swallowed = body.leave(exc_type) if body is not None else False
        ticket, line = self._ticket, self._line
        if self._token is not None and ticket is not None and line is not None:
            await release_on_exit(
                partial(self._release, line, ticket),
                self._forget_acquisition,
                what="lock",
                key=self._key,
                owner=self._owner,
                body_failed=exc is not None,
                lost_while_held=lost_while_held,
            )
        if lost_while_held and (swallowed or exc is None):
            raise LockLostError(self._key, self._owner) from exc


def _log_background_failure(task: asyncio.Task[Release]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning(
            "asynclock: background release failed (the lock expires by its TTL): %r", exc
        )


class _Holding:
    """The second half of ``async with lock`` for a lock acquired already (``_holding``)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: AsyncLock) -> None:
        self._lock = lock

    async def __aenter__(self) -> AsyncLock:
        lock = self._lock
        lock._start_holding(lock._held_since)
        return lock

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._lock.__aexit__(exc_type, exc, tb)


def _join(line: Line, ticket: Ticket) -> None:
    """Append ``ticket`` to ``line``'s waiters, with the future it is woken through."""
    ticket.future = asyncio.get_running_loop().create_future()
    line.join(ticket)


def _handed_token(ticket: Ticket) -> int | None:
    """The token of a lock handed to waiter ``ticket`` already, if it was."""
    future = ticket.future
    if future is None or not future.done() or future.cancelled():
        return None
    return future.result()


def _left_to(holder: Ticket | None, now: float) -> float | None:
    """Seconds until ``holder``'s lock expires, if it holds one (``None``: unknown)."""
    if holder is None or math.isinf(holder.expires):
        return None
    return max(holder.expires - now, 0.0)


# The locks each task holds, so that a task that ends holding some has them released. One done
# callback per task and a dict per task keep acquire and release O(1) however many locks the
# task holds (a callback per lock made each release scan the task's callbacks: 10x slower with
# 10,000 held). Guarded by a mutex: MemoryState serves event loops in several threads.
_held_by: weakref.WeakKeyDictionary[asyncio.Task[object], dict[AsyncLock, None]] = (
    weakref.WeakKeyDictionary()
)
_held_mutex = threading.Lock()


#: the last task's locks, found without the mutex and the weak dictionary (a task acquiring
#: lock after lock); one tuple, read and replaced at once. Only the task's own thread touches
#: the task's dict, and a task that ended is never current again, so a hit is always right.
_recent: tuple[weakref.ref[asyncio.Task[object]], dict[AsyncLock, None]] | None = None


def _track(task: asyncio.Task[object], lock: AsyncLock) -> None:
    global _recent
    recent = _recent
    if recent is not None and recent[0]() is task:
        recent[1][lock] = None
        return
    with _held_mutex:
        held = _held_by.get(task)
        if held is None:
            held = _held_by[task] = {}
            task.add_done_callback(_task_ended)
        _recent = (weakref.ref(task), held)
    held[lock] = None


def _untrack(task: asyncio.Task[object], lock: AsyncLock) -> None:
    recent = _recent
    if recent is not None and recent[0]() is task:
        recent[1].pop(lock, None)
        return
    with _held_mutex:
        held = _held_by.get(task)
    if held is not None:
        held.pop(lock, None)


def _task_ended(task: asyncio.Task[object]) -> None:
    global _recent
    with _held_mutex:
        held = _held_by.pop(task, None)
        recent = _recent
        if recent is not None and recent[0]() is task:
            _recent = None
    for lock in list(held or ()):
        lock._owner_task_ended(task)
