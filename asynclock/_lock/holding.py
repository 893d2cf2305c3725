"""Holding a lock: what an acquisition does from the moment the lock is its own until it is not.

:class:`Hold` is the holding half of the lock's engine, :class:`~asynclock._lock.acquisition.
Acquisition` (its base class; the acquiring half, a place in the key's line and the attempts at
the server, is in ``acquisition.py``, the public face, :class:`~asynclock.AsyncLock`, in
``lock.py``): the fencing token and the task that owns it, auto-renewal and the body a loss
cancels, the release (a handoff to this process's next waiter), a release made by a step of the
caller's, and leaving ``async with``.

Also here: the locks each task holds (:func:`track`), so that a task that ends holding some has
them released.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from functools import partial
from typing import TYPE_CHECKING

from asynclock import metrics as _metrics
from asynclock._cancel import BodyCanceller
from asynclock._errors import LockLostError, LockNotOwnedError
from asynclock._lock.leave import release_on_exit
from asynclock._lock.renew import Renewer
from asynclock._lock.waiters import release_chain, release_now
from asynclock._validate import check_ttl
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from collections.abc import Awaitable
    from types import TracebackType

    from asynclock._lock.waiters import Line, ReleaseNow, ReleaseStep, Ticket
    from asynclock.state._immediate import ImmediateSteps
    from asynclock.state._protocol import Release, State

logger = logging.getLogger("asynclock")


class Hold:
    """The holding half of one lock object's acquisitions (one at a time), for one key.

    Only :class:`~asynclock._lock.acquisition.Acquisition` is made; its ``__init__`` sets every
    attribute below. The arguments were checked by the caller (``AsyncLock`` checks the user's).

    Invariants:

    * ``token`` is not ``None`` exactly while an acquisition holds the lock through the state;
      then ``ticket`` holds it in ``line`` and ``task`` (if known) is tracked as its owner task.
      ``granted`` (``process_without_lock``) holds nothing: release and extend do nothing.
    * Only the owner task releases: if that task ends still holding the lock, the lock is
      released in the background (:meth:`owner_task_ended`), with a warning.
    * A release that starts always completes, even if its caller is cancelled (in the background
      then); ``token`` is cleared (:meth:`forget`) before the cancellation goes on.
    * Renewal (``renewer``) and the body it may cancel (``body``) exist only between entering
      the body (:meth:`start_holding`) and leaving it or releasing; a loss found while held sets
      ``lost`` and cancels the body once.
    """

    __slots__ = (
        "auto_renew",
        "body",
        "granted",
        "held_since",
        "key",
        "last_token",
        "lean",
        "line",
        "lost",
        "max_lifetime",
        "owner",
        "renewer",
        "state",
        "task",
        "ticket",
        "token",
        "ttl",
    )

    key: str
    ttl: float
    state: State
    #: the state's steps without an await, when they need none (MemoryState): the lean path
    lean: ImmediateSteps | None
    auto_renew: bool
    max_lifetime: float | None
    #: the owner id of the current (or last) acquisition; ``""`` before the first
    owner: str
    #: the fencing token while held through the state, else ``None``
    token: int | None
    #: the token of the last acquisition, once released
    last_token: int | None
    ticket: Ticket | None
    line: Line | None
    #: the task that acquired the lock, tracked while it holds it
    task: asyncio.Task[object] | None
    #: loop time the lock was acquired (or, while placed in line, the place was taken)
    held_since: float
    #: entered without acquiring (``process_without_lock``)
    granted: bool
    #: found lost while held (renewal, extend or release)
    lost: bool
    renewer: Renewer | None
    body: BodyCanceller | None

    def won(
        self,
        line: Line,
        ticket: Ticket,
        token: int,
        *,
        handed: bool = False,
        task: asyncio.Task[object] | None = None,
    ) -> bool:
        """``ticket`` holds the lock now, with ``token``; always ``True``.

        ``handed``: handed over by a release, which timed the lock's expiry already.
        ``task``: the current task, when the caller has it at hand.
        """
        if not handed:
            line.hold(ticket, self.ttl, ticket.asked_at)
        self.token = token
        self.held_since = asyncio.get_running_loop().time()
        if task is None:
            task = asyncio.current_task()
        self.task = task
        if task is not None:
            track(task, self)
        return True

    def check_held(self) -> None:
        """Raise ``RuntimeError`` unless the lock is held (or granted)."""
        if self.token is None and not self.granted:
            raise RuntimeError(f"AsyncLock {self.key!r} is not held")

    def holding(self) -> Holding:
        """``async with`` for a lock acquired (or granted) already: renewal, then release.

        Renewal counts from the acquisition (``Acquisition.hold_granted``: from the hand-out).
        """
        self.check_held()
        return Holding(self)

    def start_holding(self, since: float | None = None) -> None:
        """The body begins: start renewing (``auto_renew``), able to cancel the body.

        ``since``: the loop time the lock's TTL started, when that was before now.
        """
        if self.auto_renew and not self.granted:
            self.body = BodyCanceller()
            assert self.ticket is not None
            self.renewer = Renewer(
                self.state,
                self.key,
                self.ticket,
                self.ttl,
                self.max_lifetime,
                self.on_lost,
                started=since,
            )

    def on_lost(self, reason: str) -> None:
        """The renewer found the lock lost (or ``max_lifetime`` passed): cancel the body."""
        self.lost = True
        if active.sink is not None:
            _metrics.report("lock_lost", self.key, reason)
        logger.warning(
            "asynclock: lock %r lost while held (%s); cancelling its body",
            self.key,
            reason,
            extra={"lock_key": self.key, "owner": self.owner},
        )
        if self.body is not None:
            self.body.cancel()

    def stop_renewing(self) -> None:
        """Stop the renewer, if any."""
        if self.renewer is not None:
            self.renewer.stop()
            self.renewer = None

    def arm_release(self, release: ReleaseStep, now: ReleaseNow | None = None) -> bool:
        """Send ``release(key, owner, successor, ttl)`` instead of the state's release, once.

        The counterpart of ``Acquisition.arm_first_attempt`` (the dispatcher marks a handled
        event's claim done in the release). ``False`` when the lock is not held through the
        state (granted): nothing will be released, and the caller does its work itself.
        ``now``: the same step without an await, for the lean path.
        """
        ticket = self.ticket
        if self.token is None or ticket is None:
            return False
        ticket.release_with = release
        ticket.release_now = now
        return True

    # -- release ------------------------------------------------------------------------------

    def release(self) -> Awaitable[None]:
        """``AsyncLock.release``: release the lock (or hand it to this process's next waiter).

        Checks at the call and returns the release to await: a plain function, so that
        ``AsyncLock.release`` awaits the release with no coroutine of the engine's in between.

        Raises:
            LockNotOwnedError: (awaited) the lock had expired or been taken over before.
            RuntimeError: the lock is not held, or another task acquired it.
        """
        if self.granted:
            self.granted = False
            return asyncio.sleep(0)
        ticket, line = self.ticket, self.line
        if self.token is None or ticket is None or line is None:
            raise RuntimeError(f"cannot release AsyncLock {self.key!r}: it is not held")
        if self.task is not None and asyncio.current_task() is not self.task:
            raise RuntimeError(
                f"cannot release AsyncLock {self.key!r} from a task that did not acquire it"
            )
        return self.release_held(line, ticket)

    async def release_held(self, line: Line, ticket: Ticket) -> None:
        """Release the lock ``ticket`` holds in ``line``; it is forgotten even if cancelled."""
        self.stop_renewing()
        lean = self.lean
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
                result = await release_chain(self.state, line, ticket)
        except asyncio.CancelledError:
            self.forget()  # release_chain finishes the release in the background
            raise
        self.forget()
        if active.sink is not None:
            held = asyncio.get_running_loop().time() - self.held_since
            _metrics.report("lock_released", self.key, held)
        if not result.owned:
            self.lost = True
            raise LockNotOwnedError(self.key, ticket.owner)

    def forget(self) -> None:
        """The acquisition is over (released, or being released in the background)."""
        self.last_token = self.token
        self.token = None
        task, self.task = self.task, None
        if task is not None:
            untrack(task, self)

    def released_by_step(self) -> None:
        """The server released the lock in a step of the caller's (the inbox's release-if-empty).

        Only the local bookkeeping is left: stop renewing, forget the acquisition (so leaving
        ``async with`` sends no release) and let this process's next waiter contend.
        """
        ticket, line = self.ticket, self.line
        if self.token is None or ticket is None or line is None:
            return
        self.stop_renewing()
        self.forget()
        line.leave(ticket)

    def owner_task_ended(self, task: asyncio.Task[object]) -> None:
        """The acquiring task ended while still holding the lock: nobody can release it now."""
        ticket, line = self.ticket, self.line
        if self.token is None or ticket is None or line is None:
            return
        logger.warning(
            "asynclock: task %r ended while holding lock %r without releasing it; releasing it",
            task.get_name(),
            self.key,
            extra={"lock_key": self.key, "owner": ticket.owner},
        )
        self.forget()
        self.stop_renewing()
        released = asyncio.get_running_loop().create_task(release_chain(self.state, line, ticket))
        released.add_done_callback(log_background_failure)

    # -- extend, leaving the body -------------------------------------------------------------

    async def extend(self, ttl: float | None = None) -> None:
        """``AsyncLock.extend``: reset the lock's TTL to ``ttl`` (default: ``self.ttl``) from now.

        Raises:
            LockNotOwnedError: the lock had expired or been taken over; it is not re-created.
            RuntimeError: the lock is not held.
        """
        new_ttl = self.ttl if ttl is None else check_ttl(ttl, key=self.key)
        if self.granted:
            await asyncio.sleep(0)
            return
        ticket, line = self.ticket, self.line
        if self.token is None or ticket is None or line is None:
            raise RuntimeError(f"cannot extend AsyncLock {self.key!r}: it is not held")
        started = asyncio.get_running_loop().time()
        if not await self.state.extend(self.key, ticket.owner, new_ttl):
            self.lost = True
            raise LockNotOwnedError(self.key, ticket.owner)
        ticket.expires = started + new_ttl

    async def exit(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """Leave the body (``async with``), which ended with ``exc`` (or normally): stop renewing,
        stop cancelling the body, release.

        Never swallows ``exc``. Raises :class:`LockLostError` (from ``exc``) when the lock was
        lost while held and the body ended normally or by our cancellation; a failed release
        is translated by :func:`~asynclock._lock.leave.release_on_exit`.
        """
        if self.granted:
            self.granted = False
            return
        lost_while_held = self.lost  # set by the renewer; release_held() sets it too, later
        self.stop_renewing()
        # Stop cancelling the body before awaiting anything: the release must not be cancelled.
        body, self.body = self.body, None
        swallowed = body.leave(exc_type) if body is not None else False
        ticket, line = self.ticket, self.line
        if self.token is not None and ticket is not None and line is not None:
            await release_on_exit(
                partial(self.release_held, line, ticket),
                self.forget,
                what="lock",
                key=self.key,
                owner=self.owner,
                body_failed=exc is not None,
                lost_while_held=lost_while_held,
            )
        if lost_while_held and (swallowed or exc is None):
            raise LockLostError(self.key, self.owner) from exc


class Holding:
    """``async with`` of a lock held already (:meth:`Hold.holding`): renewal, then release."""

    __slots__ = ("hold",)

    def __init__(self, hold: Hold) -> None:
        self.hold = hold

    async def __aenter__(self) -> Hold:
        hold = self.hold
        hold.start_holding(hold.held_since)
        return hold

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Awaitable[None]:
        return self.hold.exit(exc_type, exc)


def log_background_failure(task: asyncio.Task[Release]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning(
            "asynclock: background release failed (the lock expires by its TTL): %r", exc
        )


# The locks each task holds, so that a task that ends holding some has them released. One done
# callback per task and a dict per task keep acquire and release O(1) however many locks the
# task holds (a callback per lock made each release scan the task's callbacks: 10x slower with
# 10,000 held). Guarded by a mutex: MemoryState serves event loops in several threads.
held_by: weakref.WeakKeyDictionary[asyncio.Task[object], dict[Hold, None]] = (
    weakref.WeakKeyDictionary()
)
held_mutex = threading.Lock()


#: the last task's locks, found without the mutex and the weak dictionary (a task acquiring
#: lock after lock); one tuple, read and replaced at once. Only the task's own thread touches
#: the task's dict, and a task that ended is never current again, so a hit is always right.
last_held: tuple[weakref.ref[asyncio.Task[object]], dict[Hold, None]] | None = None


def track(task: asyncio.Task[object], hold: Hold) -> None:
    """``task`` holds ``hold``'s lock: if it ends still holding it, the lock is released."""
    global last_held
    recent = last_held
    if recent is not None and recent[0]() is task:
        recent[1][hold] = None
        return
    with held_mutex:
        held = held_by.get(task)
        if held is None:
            held = held_by[task] = {}
            task.add_done_callback(task_ended)
        last_held = (weakref.ref(task), held)
    held[hold] = None


def untrack(task: asyncio.Task[object], hold: Hold) -> None:
    """``task`` no longer holds ``hold``'s lock."""
    recent = last_held
    if recent is not None and recent[0]() is task:
        recent[1].pop(hold, None)
        return
    with held_mutex:
        held = held_by.get(task)
    if held is not None:
        held.pop(hold, None)


def task_ended(task: asyncio.Task[object]) -> None:
    """``task``'s done callback (one per task that held a lock): release what it still holds."""
    global last_held
    with held_mutex:
        held = held_by.pop(task, None)
        recent = last_held
        if recent is not None and recent[0]() is task:
            last_held = None
    for hold in list(held or ()):
        hold.owner_task_ended(task)
