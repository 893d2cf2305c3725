"""A place in the key's line, kept across the caller's awaits: :class:`Place`, for the dispatcher.

An event takes its place in this process's line for its lock key the moment it arrives
(:meth:`Place.take_place`, no await), then awaits what it must (a dedupe check, a conflict
policy) before it tries the lock from that place: so no later event of the key overtakes it.
The acquiring and holding it builds on are in ``acquisition.py`` and ``holding.py``.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from asynclock._lock.acquisition import Acquisition, join_line, left_to
from asynclock._lock.turn import current_turn

if TYPE_CHECKING:
    from asynclock._lock.waiters import Line, Ticket
    from asynclock.state._protocol import Grant


class Place(Acquisition):
    """An :class:`Acquisition` that takes its place in line first and asks the server later.

    Invariants (besides :class:`Acquisition`'s): ``placed`` from :meth:`take_place` (or
    :meth:`adopt_place`) until the lock is won, refused, or the place is left; exactly one of
    :meth:`try_from_place` (then, if it returned ``False``, :meth:`wait_turn` or
    :meth:`leave_place`) or :meth:`leave_place` follows the place; a lock handed over to the
    place meanwhile is never lost: it is taken (:meth:`try_from_place`, :meth:`wait_turn`) or
    passed on (:meth:`leave_place`).
    """

    __slots__ = ()

    def take_place(self) -> None:
        """Join this process's line for the key now, without asking the server and without awaiting.

        The dispatcher's arrival-order guarantee rests on this: an event takes its place the
        moment it arrives, so nothing it awaits next (a dedupe check, a conflict policy) lets a
        later event of the same key overtake it. Exactly one of :meth:`try_from_place` (then,
        if it returned ``False``, :meth:`wait_turn` or :meth:`leave_place`) or
        :meth:`leave_place` must follow.
        """
        self.check_idle()
        line, ticket = self.new_ticket()
        if line.member is None:
            line.member = ticket
        else:
            join_line(line, ticket)
        self.placed_now()

    def adopt_place(self, line: Line, ticket: Ticket) -> None:
        """:meth:`take_place` with ``ticket``, the member of ``line`` already (the dispatcher's
        lean path hands its place over when it found the key busy)."""
        self.use_ticket(line, ticket)
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
        if lean is not None and current_turn() is None and lean.steps_are_own():
            # the lean path: one yield, then the first attempt as one step, without an await
            first, self.first_attempt_now = self.first_attempt_now, None
            self.first_attempt = None
            ticket.asked_at = asyncio.get_running_loop().time()
            self.busy = True
            try:
                await asyncio.sleep(0)  # the yield rule; nothing was asked of the state yet
                if first is None:
                    grant: Grant | None = lean.acquire_now(self.key, ticket.owner, self.ttl)
                else:
                    grant = first(ticket.owner)
            except BaseException:
                self.placed = False
                line.leave(ticket)
                raise
            finally:
                self.busy = False
            if grant is None:  # refused by the armed step
                self.refused = True
                self.placed = False
                line.leave(ticket)
                return False
            if grant.token is not None:
                self.placed = False
                self.report(self.won(line, ticket, grant.token), placed_at)
                return True
            self.retry_after = grant.retry_after  # the place is kept
            self.report(False, placed_at)
            return False
        self.busy = True
        try:
            won = await self.contend(line, ticket, False, None, keep_place=True)
        except BaseException:
            self.placed = False  # contend left the line
            raise
        finally:
            self.busy = False
        if won or self.refused:
            self.placed = False
        if not self.refused:
            self.report(won, placed_at)
        return won

    async def wait_turn(self, deadline: float | None) -> bool:
        """Wait from the place kept until the lock is ours (``False``: ``deadline`` passed)."""
        ticket, line = self.ticket, self.line
        assert self.placed
        assert ticket is not None
        assert line is not None
        placed_at = self.held_since
        self.busy = True
        try:
            handed = handed_token(ticket)
            if handed is not None:
                won = self.won(line, ticket, handed, handed=True)
            elif line.member is ticket:
                won = await self.contend(line, ticket, True, deadline)
            else:
                won = await self.wait_in_line(line, ticket, deadline)
        finally:
            self.placed = False
            self.busy = False
        self.contended = True
        if won:
            self.report(True, placed_at)
        return won

    async def leave_place(self) -> None:
        """Give the place up, passing on a lock handed over meanwhile. Idempotent."""
        ticket, line = self.ticket, self.line
        if not self.placed or ticket is None or line is None:
            return
        self.placed = False
        if ticket.future is not None:
            await self.abandon_waiting(line, ticket)
        else:  # the member, with nothing on the server: its one attempt found the key busy
            line.leave(ticket)


def handed_token(ticket: Ticket) -> int | None:
    """The token of a lock handed to waiter ``ticket`` already, if it was."""
    future = ticket.future
    if future is None or not future.done() or future.cancelled():
        return None
    return future.result()
