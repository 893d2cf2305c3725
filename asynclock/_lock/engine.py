"""The lock's engine, uncontended: a place in the key's line, one try, holding, the release.

Size: one concern, the path of an uncontended lock (and of every event the dispatcher or the
inbox handles on a free key), kept in one module so that path runs one module of the engine
(docs/decisions.md, "What the path of one event costs in modules"): this process's line for
the key (:class:`Line`, :class:`Ticket`, :func:`line_for`), :class:`Engine` (take a place, try
once, hold a lock acquired or handed out, release it, leave ``async with``), the release's
hand-over to this process's next waiter (:func:`release_chain`) and the locks each task holds
(:func:`track`). What an uncontended path never runs is elsewhere: waiting in line and
contending (``acquisition.py``, whose :class:`~asynclock._lock.acquisition.Acquisition` is the
engine's one class of objects), renewal's task (``renew.py``, started by a timer armed here).

The line: only one member of a line talks to the server at a time: the *member* holds the lock
or is contending for it, everyone else waits in FIFO order in ``waiters``. That is what makes
waiters of one process first-come-first-served, keeps the server's load at one contender per
process per key, and lets a release hand the lock straight to the next waiter in the same
atomic server step (``State.release(successor=...)``): one round trip per handoff.

Invariants of the line:

* ``member`` is the :class:`Ticket` that most recently won the lock or was promoted to contend.
  A ticket acts on the line (hands over, promotes) only while it is the member, so a stale
  holder whose lock expired can never disturb the queue it left.
* A waiter's future resolves at most once: to a fencing token (the lock was handed over: the
  waiter holds it) or to ``None`` (the waiter is now the member and must contend).
* A waiter never waits past the member's expected expiry (``Ticket.expires``): if the holder
  vanished without releasing, the head waiter takes over and contends on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import weakref
from collections import deque
from functools import partial
from typing import TYPE_CHECKING, TypeAlias

from asynclock import metrics as _metrics
from asynclock._cancel import (
    BodyCanceller,
    clean_up,
    finish_despite_cancellation,
    run_in_background,
)
from asynclock._errors import (
    LockAcquisitionError,
    LockLostError,
    LockNotOwnedError,
    StateUnavailableError,
)
from asynclock._lock.renew import Renewer
from asynclock._lock.turn import current_turn
from asynclock._owner import new_owner
from asynclock._timers import call_after, first_renewal
from asynclock._validate import check_ttl
from asynclock.metrics._active import active
from asynclock.state._immediate import immediate_steps
from asynclock.state._protocol import Grant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from asynclock._timers import Timer
    from asynclock.state._immediate import ImmediateSteps
    from asynclock.state._protocol import Release, State

    #: a release to send instead of the state's: ``(key, owner, successor, successor_ttl)``
    ReleaseStep: TypeAlias = Callable[[str, str, str | None, float | None], Awaitable[Release]]
    #: the same without an await (MemoryState's lean path)
    ReleaseNow: TypeAlias = Callable[[str, str, str | None, float | None], Release]

logger = logging.getLogger("asynclock")

NOT_GRANTED = Grant(None, None)


# -- the line ------------------------------------------------------------------------------------


class Ticket:
    """One acquisition attempt: its owner id, TTL, and the future a waiter sleeps on.

    (``LeanHold.__init__`` sets these attributes inline: keep the two in step.)
    """

    __slots__ = ("asked_at", "expires", "future", "owner", "release_now", "release_with", "ttl")

    #: whether a lock handed to this ticket by :func:`release_now` goes on MemoryState's sweep
    #: heap (a LeanHold's does not: the lean path releases or renews it itself)
    swept = True

    def __init__(self, owner: str, ttl: float) -> None:
        self.owner = owner
        self.ttl = ttl
        #: the release to send for this ticket instead of the state's (``Engine.arm_release``)
        self.release_with: ReleaseStep | None = None
        #: ``release_with``'s counterpart without an await, for the lean path
        self.release_now: ReleaseNow | None = None
        #: loop time when this ticket's last acquire was sent
        self.asked_at = 0.0
        self.future: asyncio.Future[int | None] | None = None
        #: loop time by which this ticket's lock expires if it holds it (inf while contending)
        self.expires = math.inf

    def live(self) -> bool:
        """Whether a waiter still sleeps on this ticket's future."""
        return self.future is not None and not self.future.done()


#: the waiters of every line nobody waits in: never appended to (see :meth:`Line.join`), so a
#: free key's line, made and dropped once per uncontended acquisition, allocates no deque
_NOBODY: deque[Ticket] = deque()


class Line:
    """The member and the FIFO waiters of one key, in one event loop."""

    __slots__ = ("_index", "_lines", "key", "member", "waiters")

    def __init__(self, index: tuple[int, str], lines: dict[tuple[int, str], Line]) -> None:
        self.key = index[1]
        self.member: Ticket | None = None
        #: the waiters, oldest first; the shared empty deque until someone waits (:meth:`join`)
        self.waiters: deque[Ticket] = _NOBODY
        self._lines = lines
        self._index = index  # (id of the event loop, key): where ``lines`` keeps this line

    def hold(self, ticket: Ticket, ttl: float, since: float) -> None:
        """``ticket`` now holds the lock for ``ttl`` seconds from ``since`` (loop time).

        ``since`` is when the granting command was *sent*: the server started the TTL between
        then and its reply, so this estimate of the expiry is never later than the server's.
        """
        self.member = ticket
        ticket.expires = since + ttl

    def join(self, ticket: Ticket) -> None:
        """Append waiter ``ticket`` (the only way into ``waiters``)."""
        if self.waiters is _NOBODY:
            self.waiters = deque()
        self.waiters.append(ticket)

    def next_waiter(self) -> Ticket | None:
        """Pop the first waiter that still waits (skipping those that timed out or left)."""
        while self.waiters:
            ticket = self.waiters.popleft()
            if ticket.live():
                return ticket
        return None

    def promote(self, first: Ticket | None = None) -> None:
        """Make ``first`` (else the next live waiter) the member that contends; else vacate."""
        if first is None and not self.waiters:  # the common case: nobody waits
            self.member = None
            self._lines.pop(self._index, None)
            return
        ticket = first if first is not None and first.live() else self.next_waiter()
        self.member = ticket
        if ticket is not None:
            ticket.expires = math.inf
            assert ticket.future is not None
            ticket.future.set_result(None)
        elif not self.waiters:
            self._lines.pop(self._index, None)

    def leave(self, ticket: Ticket) -> None:
        """``ticket`` stops being the member without a lock to pass on."""
        if self.member is ticket:
            self.promote()

    def drop_waiter(self, ticket: Ticket) -> None:
        """Remove a waiter that gave up before its future resolved."""
        with contextlib.suppress(ValueError):
            self.waiters.remove(ticket)
        if self.member is None and not self.waiters:
            self._lines.pop(self._index, None)


def join_line(line: Line, ticket: Ticket) -> None:
    """Append ``ticket`` to ``line``'s waiters, with the future it is woken through."""
    ticket.future = asyncio.get_running_loop().create_future()
    line.join(ticket)


def left_to(holder: Ticket | None, now: float) -> float | None:
    """Seconds until ``holder``'s lock expires, if it holds one (``None``: unknown)."""
    if holder is None or math.isinf(holder.expires):
        return None
    return max(holder.expires - now, 0.0)


_registry: weakref.WeakKeyDictionary[State, dict[tuple[int, str], Line]] = (
    weakref.WeakKeyDictionary()
)


#: the last state's lines, found without the weak dictionary's lookup (nearly every process
#: uses one state); one tuple, read and replaced at once, so threads never see half of it
_recent: tuple[weakref.ref[State], dict[tuple[int, str], Line]] | None = None


def line_for(state: State, key: str, loop: asyncio.AbstractEventLoop | None = None) -> Line:
    """The line of ``key`` on ``state`` in the running event loop (created on demand);
    ``loop``: the running loop, when the caller has it at hand already."""
    global _recent
    recent = _recent
    if recent is not None and recent[0]() is state:
        lines = recent[1]
    else:
        try:
            lines = _registry[state]
        except KeyError:
            lines = _registry.setdefault(state, {})
        _recent = (weakref.ref(state), lines)
    index = (id(loop or asyncio.get_running_loop()), key)
    line = lines.get(index)
    if line is None:
        line = lines[index] = Line(index, lines)
    return line


# -- the release, handed to the next waiter --------------------------------------------------------


async def release_chain(state: State, line: Line, ticket: Ticket) -> Release:
    """Release ``ticket``'s lock, handing it to the next live waiter when there is one.

    Returns the server's answer for ``ticket`` itself. If the successor left while the handoff
    was on the wire, the lock is passed on again on its behalf, so it is never left with nobody.
    If the chain is interrupted (cancelled, server unreachable), the lock is released in the
    background and the successor contends like anyone else.
    """
    first: Release | None = None
    current = ticket
    successor: Ticket | None = None
    try:
        while True:
            successor = line.next_waiter() if line.member is current else None
            if successor is None:
                result = await _send_release(state, line.key, current, None)
                if line.member is current:
                    line.promote()
                return first or result
            sent = asyncio.get_running_loop().time()
            result = await _send_release(state, line.key, current, successor)
            first = first or result
            if not result.owned or result.handoff_token is None:
                # our lock was lost, or the backend let a waiter of another process go first
                line.promote(successor)
                return first
            line.hold(successor, successor.ttl, sent)
            if successor.live():
                assert successor.future is not None
                successor.future.set_result(result.handoff_token)
                return first
            current = successor  # it gave up meanwhile: pass the lock on in its name
    except BaseException as exc:
        # The outcome is unknown. Release by owner (harmless if the first try did land); a
        # successor contends with its own owner id, and acquire is idempotent per owner, so if
        # the handoff did happen it simply gets its token. On cancellation the release is
        # finished before the CancelledError goes on, so the key is free once the task is done.
        cancelled = isinstance(exc, asyncio.CancelledError)
        await clean_up(state.release(line.key, current.owner), wait=cancelled)
        if successor is not None and not successor.live():
            # the handoff may have landed on a waiter who left meanwhile
            await clean_up(state.abandon(line.key, successor.owner), wait=cancelled)
        if successor is not None:
            line.promote(successor)
        elif line.member is current:
            line.promote()
        raise


def release_now(
    state: ImmediateSteps,
    line: Line,
    ticket: Ticket,
    claim: str | None = None,
    claim_ttl: float = 0.0,
) -> Release:
    """:func:`release_chain` on MemoryState's lean path, without an await: the caller yielded.

    ``claim``: a dedupe record to keep for ``claim_ttl`` in the same step (a handled event's).

    Nothing runs between choosing the successor and handing it the lock, so the successor is
    still waiting when it gets it, and none of release_chain's passing on or undoing is needed.
    """
    successor = line.next_waiter() if line.member is ticket and line.waiters else None
    owner, ttl, sent, swept = None, None, 0.0, True
    if successor is not None:
        owner, ttl, swept = successor.owner, successor.ttl, successor.swept
        sent = asyncio.get_running_loop().time()
    step, ticket.release_now, ticket.release_with = ticket.release_now, None, None
    if step is None:
        result = state.release_now(line.key, ticket.owner, claim, claim_ttl, owner, ttl, swept)
    else:
        result = step(line.key, ticket.owner, owner, ttl)
    if successor is None:
        if line.member is ticket:
            line.promote()
    elif result.owned and result.handoff_token is not None:
        line.hold(successor, successor.ttl, sent)
        assert successor.future is not None
        successor.future.set_result(result.handoff_token)
    else:  # our lock was lost, or a waiter of another event loop goes first
        line.promote(successor)
    return result


def _send_release(
    state: State, key: str, current: Ticket, successor: Ticket | None
) -> Awaitable[Release]:
    """``current``'s release (a handoff to ``successor`` if given), by its own step if armed."""
    owner, ttl = (successor.owner, successor.ttl) if successor is not None else (None, None)
    step, current.release_with, current.release_now = current.release_with, None, None
    if step is None:
        return state.release(key, current.owner, successor=owner, ttl=ttl)
    return step(key, current.owner, owner, ttl)


# -- the engine ----------------------------------------------------------------------------------


class Engine:
    """A lock's acquisitions of one key, one at a time, by the task that made each: the
    uncontended part. Only its subclass :class:`~asynclock._lock.acquisition.Acquisition` (which
    adds waiting and contending) is made.

    The arguments are the checked ones of :class:`~asynclock.AsyncLock` (whose docstring says
    what each means); nothing here checks them again.

    Invariants:

    * Every acquisition gets a fresh owner id and :class:`Ticket`; only the line's member asks
      the server, the others wait in arrival order (``acquisition.py``).
    * ``busy`` while an acquire or a place's attempt runs. Acquiring while busy, held or granted
      raises ``RuntimeError`` (not reentrant); so does taking a place or a lock handed out
      (:meth:`hold_granted`) while placed as well.
    * ``placed`` from :meth:`take_place` until the lock is won, refused, or the place is left;
      exactly one of :meth:`try_from_place` (then, if it returned ``False``, ``wait_turn`` or
      ``leave_place``) or ``leave_place`` follows the place; a lock handed over to the place
      meanwhile is never lost: it is taken or passed on.
    * ``refused``: the armed first attempt (:meth:`arm_first_attempt`) refused; the lock was
      not acquired (and the place is gone).
    * Cancellation: at every await, a cancelled acquisition leaves nothing behind: an attempt
      whose outcome is unknown is undone at the server, and the line forgets the ticket.
    * ``token`` is not ``None`` exactly while an acquisition holds the lock through the state;
      then ``ticket`` holds it in ``line`` and ``task`` (if known) is tracked as its owner task.
      ``granted`` (``process_without_lock``) holds nothing: release and extend do nothing.
    * Only the owner task releases: if that task ends still holding the lock, the lock is
      released in the background (:meth:`owner_task_ended`), with a warning.
    * A release that starts always completes, even if its caller is cancelled (in the background
      then); ``token`` is cleared (:meth:`forget`) before the cancellation goes on.
    * Renewal (``renewal``, then ``renewer``) and the body it may cancel (``body``) exist only
      between entering the body (:meth:`start_holding`) and leaving it or releasing; a loss
      found while held sets ``lost`` and cancels the body once.
    """

    __slots__ = (
        "auto_renew",
        "blocking",
        "body",
        "busy",
        "contended",
        "first_attempt",
        "first_attempt_now",
        "granted",
        "held_since",
        "key",
        "last_token",
        "lean",
        "line",
        "lost",
        "max_lifetime",
        "owner",
        "placed",
        "refused",
        "renew_from",
        "renewal",
        "renewer",
        "retry_after",
        "state",
        "task",
        "ticket",
        "timeout",
        "token",
        "ttl",
    )

    def __init__(
        self,
        state: State,
        key: str,
        ttl: float,
        blocking: bool = True,
        timeout: float | None = None,
        auto_renew: bool = False,
        max_lifetime: float | None = None,
    ) -> None:
        self.key = key
        self.ttl = ttl
        self.timeout = timeout
        self.max_lifetime = max_lifetime
        self.state = state
        #: the lean path (docs/decisions.md): the state's steps without an await, when they
        #: need none (MemoryState), so the lock yields once itself and acts at once
        self.lean: ImmediateSteps | None = immediate_steps(state)
        self.blocking = blocking
        self.auto_renew = auto_renew
        #: the owner id of the current (or last) acquisition; ``""`` before the first
        self.owner = ""
        #: the fencing token while held through the state, else ``None``
        self.token: int | None = None
        self.ticket: Ticket | None = None
        self.line: Line | None = None
        #: the task that acquired the lock, tracked while it holds it
        self.task: asyncio.Task[object] | None = None
        self.busy = False
        #: the acquire waited (for a handover or a release) before it got the lock
        self.contended = False
        #: loop time the lock was acquired (or, while placed in line, the place was taken)
        self.held_since = 0.0
        #: entered without acquiring (``process_without_lock``)
        self.granted = False
        #: a place taken in the key's line, not yet tried from or left
        self.placed = False
        self.refused = False
        self.first_attempt: Callable[[str], Awaitable[Grant | None]] | None = None
        self.first_attempt_now: Callable[[str], Grant | None] | None = None
        #: the token of the last acquisition, once released
        self.last_token: int | None = None
        #: found lost while held (renewal, extend or release)
        self.lost = False
        #: after a failed acquire: seconds until the holder's lock expires, if known
        self.retry_after: float | None = None
        #: the timer of the first renewal, until it is due (then ``renewer`` renews)
        self.renewal: Timer | None = None
        #: loop time the renewal schedule counts from
        self.renew_from = 0.0
        self.renewer: Renewer | None = None
        self.body: BodyCanceller | None = None

    # -- a place in line, one try ----------------------------------------------------------------

    def take_place(self) -> None:
        """Join this process's line for the key now, without asking the server and without awaiting.

        The dispatcher's arrival-order guarantee rests on this: an event takes its place the
        moment it arrives, so nothing it awaits next (a dedupe check, a conflict policy) lets a
        later event of the same key overtake it. Exactly one of :meth:`try_from_place` (then,
        if it returned ``False``, ``wait_turn`` or ``leave_place``) or ``leave_place`` must
        follow.
        """
        self.check_idle()
        line, ticket = self.new_ticket()
        if line.member is None:
            line.member = ticket
        else:
            join_line(line, ticket)
        self.placed_now()

    def placed_now(self) -> None:
        """The place is taken: the acquire is timed from now (``held_since``, for the metrics)."""
        self.placed = True
        self.contended = False
        self.held_since = asyncio.get_running_loop().time()  # when the place was taken

    def first_in_line(self) -> bool:
        """Whether the place taken is the line's member (the one that asks the state)."""
        return self.line is not None and self.line.member is self.ticket

    async def try_from_place(self) -> bool:
        """Acquire without waiting, from the place taken; on ``False`` the place is kept
        (unless :attr:`refused`).

        Only the line's member asks the server (one attempt); a waiter behind a member of this
        process answers ``False`` at once, unless the lock was handed to it meanwhile.
        """
        ticket, line = self.ticket, self.line
        assert self.placed
        assert ticket is not None
        assert line is not None
        placed_at = self.held_since
        handed = handed_token(ticket)
        if handed is not None:
            self.placed = False
            self.contended = True
            self.report(self.won(line, ticket, handed, handed=True), placed_at)
            return True
        if line.member is not ticket:
            self.retry_after = left_to(line.member, asyncio.get_running_loop().time())
            self.report(False, placed_at)
            return False
        lean = self.lean
        self.busy = True
        try:
            if lean is not None and current_turn() is None and lean.steps_are_own():
                # the lean path: one yield, then the first attempt as one step, without an await
                first, self.first_attempt_now = self.first_attempt_now, None
                self.first_attempt = None
                ticket.asked_at = asyncio.get_running_loop().time()
                await asyncio.sleep(0)  # the yield rule; nothing was asked of the state yet
                if first is None:
                    grant = lean.acquire_now(self.key, ticket.owner, self.ttl)
                else:
                    step = first(ticket.owner)
                    if step is None:
                        self.refused = True
                    grant = NOT_GRANTED if step is None else step
            else:
                grant = await self.attempt(line, ticket, waiting=False)
        except BaseException:
            self.placed = False
            line.leave(ticket)
            raise
        finally:
            self.busy = False
        if grant.token is not None:
            self.placed = False
            self.report(self.won(line, ticket, grant.token), placed_at)
            return True
        if self.refused:  # by the armed step: the place is gone
            self.placed = False
            line.leave(ticket)
            return False
        self.retry_after = grant.retry_after  # the place is kept
        self.report(False, placed_at)
        return False

    async def attempt(self, line: Line, ticket: Ticket, *, waiting: bool) -> Grant:
        """One server acquire. If its outcome is unknown (cancelled, timed out), undo it."""
        ticket.asked_at = asyncio.get_running_loop().time()
        try:
            first = self.first_attempt
            if first is not None and not waiting:
                self.first_attempt = None
                grant = await first(ticket.owner)
                if grant is None:
                    self.refused = True
                    return NOT_GRANTED
                return grant
            turn = current_turn()
            if turn is not None and not waiting:
                # a fair retry (asynclock._lock.turn): take the key only in first-conflict order
                return await turn.acquire(self.state, self.key, ticket.owner, self.ttl)
            return await self.state.acquire(self.key, ticket.owner, self.ttl, waiting=waiting)
        except asyncio.CancelledError:
            # The server may have granted the lock, or may still if the command is on the
            # wire. Undo it before the cancellation goes on, so the key is free once the task
            # is done (bounded by the backend's operation timeout).
            await finish_despite_cancellation(self.state.abandon(self.key, ticket.owner))
            raise
        except BaseException:
            run_in_background(self.state.abandon(self.key, ticket.owner))
            raise

    def arm_first_attempt(
        self,
        attempt: Callable[[str], Awaitable[Grant | None]],
        now: Callable[[str], Grant | None] | None = None,
    ) -> None:
        """Send ``attempt(owner)`` instead of the state's acquire for the next first try.

        For callers that fold more work into the acquire's atomic step (the dispatcher records
        an event's dedupe claim in it: one round trip per fresh event). ``attempt`` answers like
        ``State.acquire``, or ``None`` to refuse: the lock is then not acquired and
        :attr:`refused` is set. Used once, and only if this acquisition does reach the server.
        ``now``: the same step without an await, used instead on the lean path.
        """
        self.first_attempt = attempt
        self.first_attempt_now = now

    def report(self, acquired: bool, started: float) -> None:
        """Report the acquire begun at loop time ``started`` to the metrics sink, if any."""
        if active.sink is not None:
            if acquired:
                waited = asyncio.get_running_loop().time() - started
                _metrics.report("lock_acquired", self.key, waited, self.contended)
            else:
                _metrics.report("lock_conflict", self.key)

    def new_ticket(self, task: asyncio.Task[object] | None = None) -> tuple[Line, Ticket]:
        """A fresh acquisition: a new owner id and its ticket in this process's line for the key.

        ``task``: the current task, when the caller has it at hand already.
        """
        line, ticket = line_for(self.state, self.key), Ticket(new_owner(task), self.ttl)
        self.use_ticket(line, ticket)
        return line, ticket

    def use_ticket(self, line: Line, ticket: Ticket) -> None:
        """Make ``ticket`` of ``line`` the current acquisition's (not held yet)."""
        self.owner = ticket.owner
        self.lost = False
        self.refused = False
        self.retry_after = None
        self.ticket, self.line = ticket, line

    def check_idle(self) -> None:
        """Raise ``RuntimeError`` if the lock is held, granted, being acquired or placed."""
        if self.busy or self.placed or self.token is not None or self.granted:
            raise RuntimeError(f"AsyncLock {self.key!r} is already held or being acquired")

    # -- holding ---------------------------------------------------------------------------------

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

    def hold_granted(self, owner: str, token: int, since: float) -> None:
        """Hold the lock the state handed to this task for ``owner`` at loop time ``since``
        (the inbox's hand-out), as if this object had acquired it then.

        ``async with self.holding()`` follows: it renews the lock on the schedule that began at
        ``since`` and releases it on exit (unless a step of the caller released it first).
        """
        self.check_idle()
        line, ticket = line_for(self.state, self.key), Ticket(owner, self.ttl)
        self.use_ticket(line, ticket)
        if line.member is None:
            line.hold(ticket, self.ttl, since)
        else:  # an acquirer of this process contends at the server: the release wakes it
            ticket.expires = since + self.ttl
        self.won(line, ticket, token, handed=True)
        self.held_since = since

    def check_held(self) -> None:
        """Raise ``RuntimeError`` unless the lock is held (or granted)."""
        if self.token is None and not self.granted:
            raise RuntimeError(f"AsyncLock {self.key!r} is not held")

    def entered(self) -> None:
        """After ``acquire`` for ``async with``: the body begins (raises
        ``LockAcquisitionError`` if a non-blocking acquire found the lock held)."""
        if self.granted:
            return
        if self.token is None:
            raise LockAcquisitionError(self.key, self.ttl, self.retry_after)
        self.start_holding()

    def holding(self) -> Holding:
        """``async with`` for a lock acquired (or granted) already: renewal, then release.

        Renewal counts from the acquisition (:meth:`hold_granted`: from the hand-out).
        """
        self.check_held()
        return Holding(self)

    def start_holding(self, since: float | None = None) -> None:
        """The body begins: start renewing (``auto_renew``), able to cancel the body.

        ``since``: the loop time the lock's TTL started, when that was before now. Only a timer
        is armed here; the renewer (``renew.py``) is made when the first renewal is due, which
        is never for nearly every body.
        """
        if self.auto_renew and not self.granted:
            self.body = BodyCanceller()
            self.renew_from = asyncio.get_running_loop().time() if since is None else since
            self.renewal = call_after(
                since, first_renewal(self.ttl, self.max_lifetime), self.renewal_due
            )

    def renewal_due(self) -> None:
        """The first renewal (or the ``max_lifetime`` cap) is due: renew from now on."""
        self.renewal = None
        assert self.ticket is not None
        self.renewer = Renewer(
            self.state,
            self.key,
            self.ticket,
            self.ttl,
            self.max_lifetime,
            self.on_lost,
            started=self.renew_from,
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
        """Stop the renewal (its timer, or the renewer), if any."""
        if self.renewal is not None:
            self.renewal.cancel()
            self.renewal = None
        if self.renewer is not None:
            self.renewer.stop()
            self.renewer = None

    def arm_release(self, release: ReleaseStep, now: ReleaseNow | None = None) -> bool:
        """Send ``release(key, owner, successor, ttl)`` instead of the state's release, once.

        The counterpart of :meth:`arm_first_attempt` (the dispatcher marks a handled event's
        claim done in the release). ``False`` when the lock is not held through the state
        (granted): nothing will be released, and the caller does its work itself.
        ``now``: the same step without an await, for the lean path.
        """
        ticket = self.ticket
        if self.token is None or ticket is None:
            return False
        ticket.release_with = release
        ticket.release_now = now
        return True

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

    # -- release -----------------------------------------------------------------------------

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

    async def exit(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """Leave the body (``async with``), which ended with ``exc`` (or normally): stop renewing,
        stop cancelling the body, release.

        Never swallows ``exc``. Raises :class:`LockLostError` (from ``exc``) when the lock was
        lost while held and the body ended normally or by our cancellation; a failed release
        is translated by :func:`release_on_exit`.
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
    """``async with`` of a lock held already (:meth:`Engine.holding`): renewal, then release."""

    __slots__ = ("hold",)

    def __init__(self, hold: Engine) -> None:
        self.hold = hold

    async def __aenter__(self) -> Engine:
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


def handed_token(ticket: Ticket) -> int | None:
    """The token of a lock handed to waiter ``ticket`` already, if it was."""
    future = ticket.future
    if future is None or not future.done() or future.cancelled():
        return None
    return future.result()


async def release_on_exit(
    release: Callable[[], Awaitable[None]],
    forget: Callable[[], None],
    *,
    what: str,
    key: str,
    owner: str,
    body_failed: bool,
    lost_while_held: bool,
) -> None:
    """Run ``release()`` at the end of an ``async with`` body, translating its failure.

    Shared by :meth:`Engine.exit` and :class:`~asynclock.Semaphore`'s ``__aexit__``, which
    report a loss the same way: what differs (how each releases, what it forgets) comes in as
    callables.

    * ``LockNotOwnedError`` (the lock or permit had expired): when the body ended normally and
      nobody saw the loss yet, the body ran past its life: raise :class:`LockLostError` (what
      ``async with`` reports; an explicit ``release()`` says "not owned"); else log it.
    * ``StateUnavailableError``: re-raised, unless the loss was seen already (the renewer gave
      it up because the state stayed unreachable until the TTL ran out): then ``forget()`` and
      log it, since what the caller must learn is the loss, not the outage (the release goes on
      in the background).

    ``what`` names the thing in log messages (``"lock"``, ``"permit of semaphore"``).
    """
    try:
        await release()
    except LockNotOwnedError as not_owned:
        if not body_failed and not lost_while_held:
            raise LockLostError(key, owner) from not_owned
        logger.warning(
            "asynclock: %s %r had expired before its body finished",
            what,
            key,
            extra={"lock_key": key, "owner": owner},
        )
    except StateUnavailableError:
        if not lost_while_held:
            raise
        forget()
        logger.warning(
            "asynclock: %s %r was lost during an outage; its release did not get through",
            what,
            key,
            extra={"lock_key": key, "owner": owner},
        )


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
held_by: weakref.WeakKeyDictionary[asyncio.Task[object], dict[Engine, None]] = (
    weakref.WeakKeyDictionary()
)
held_mutex = threading.Lock()


#: the last task's locks, found without the mutex and the weak dictionary (a task acquiring
#: lock after lock); one tuple, read and replaced at once. Only the task's own thread touches
#: the task's dict, and a task that ended is never current again, so a hit is always right.
last_held: tuple[weakref.ref[asyncio.Task[object]], dict[Engine, None]] | None = None


def track(task: asyncio.Task[object], hold: Engine) -> None:
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


def untrack(task: asyncio.Task[object], hold: Engine) -> None:
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
