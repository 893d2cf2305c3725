"""The waiters: this process's queue of acquirers for one key of one state (its "line").

Only one member of a line talks to the server at a time: the *member* holds the lock or is
contending for it, everyone else waits in FIFO order in ``waiters``. That is what makes
waiters of one process first-come-first-served, keeps the server's load at one contender per
process per key, and lets a release hand the lock straight to the next waiter in the same
atomic server step (``State.release(successor=...)``): one round trip per handoff.

Invariants:

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
import math
import weakref
from collections import deque
from typing import TYPE_CHECKING, TypeAlias

from asynclock._cancel import clean_up

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock.state._immediate import ImmediateSteps
    from asynclock.state._protocol import Release, State

    #: a release to send instead of the state's: ``(key, owner, successor, successor_ttl)``
    ReleaseStep: TypeAlias = Callable[[str, str, str | None, float | None], Awaitable[Release]]
    #: the same without an await (MemoryState's lean path)
    ReleaseNow: TypeAlias = Callable[[str, str, str | None, float | None], Release]


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
        #: the release to send for this ticket instead of the state's (``Hold.arm_release``)
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


async def wait_for_turn(future: asyncio.Future[int | None], until: float) -> None:
    """Wait until a waiter's ``future`` is done, or until loop time ``until`` (``inf``: no limit).

    ``asyncio.wait((future,), timeout=...)`` for one future, without its generality (a set, a
    check of every awaitable, an inner coroutine): a third of a queued event's waiting cost.
    Like it, this never cancels ``future``; a cancellation of the caller only ends the wait.
    """
    if future.done():
        return
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[None] = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    handle = loop.call_at(until, wake) if until != math.inf else None
    try:
        await waiter
    finally:
        if handle is not None:
            handle.cancel()
        future.remove_done_callback(wake)


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
