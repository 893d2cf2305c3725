"""Taking a permit: one try, then (when blocking) a place in the key's queue and push wake-ups.

While waiters of this event loop wait for a key already, a newcomer skips the try (it would be
refused behind them) and goes straight to its place. A waiter never polls blindly. After a
refused try it subscribes to its wake-ups
(:meth:`~asynclock.state.SemaphoreState.semaphore_watch`) *before* it asks for a place, so a
release between the refusal and the wait cannot be missed; then it sleeps until a release makes
it eligible (the state wakes exactly the waiters a release made eligible), bounded by the
refusal's ``retry_after`` (a dead holder's permit, a dead waiter's place ahead) and by
:data:`PLACE_REFRESH`, when it renews its place.

Cancellation: an attempt whose outcome the caller never learns (cancelled, timed out on the
wire) is undone with ``semaphore_abandon`` before the cancellation goes on, and so is a place
left behind by a waiter that stops waiting, so the next waiter is woken at once.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from asynclock._cancel import clean_up, finish_despite_cancellation, run_in_background

if TYPE_CHECKING:
    from asynclock.state._protocol import Grant, SemaphoreState

__all__ = ["PLACE_HOLD", "PLACE_REFRESH", "take_permit"]

#: seconds a waiter's place in the queue is kept after its last attempt: a waiter that died
#: (kill -9) keeps the permits reserved for it at most this long
PLACE_HOLD = 5.0
#: a live waiter renews its place this often, even when nothing wakes it
PLACE_REFRESH = PLACE_HOLD / 3
#: never re-ask the state sooner than this after it said "a permit expires now"
_MIN_WAIT = 0.001

#: this event loop's waiters per (state, loop, key): while a key has some, it is contended and
#: subscribed here already, so a newcomer skips the try (it would only be refused behind them)
#: and asks for its place at once: one request fewer per contended acquisition. Keyed by loop
#: too, so only one thread ever touches an entry (MemoryState serves loops in several threads)
_waiting: dict[tuple[int, int, str], int] = {}


async def take_permit(
    state: SemaphoreState,
    key: str,
    owner: str,
    limit: int,
    ttl: float,
    *,
    blocking: bool,
    deadline: float | None,
) -> tuple[Grant, float]:
    """Take a permit of ``key`` for ``owner``, waiting in turn when ``blocking``.

    Returns the last answer (a token, or the refusal's ``retry_after``) and the loop time its
    request was sent (the permit expires ``ttl`` after the server received it: never before).
    ``deadline`` (loop time) bounds the wait; at it the caller's place is given up.
    """
    loop = asyncio.get_running_loop()
    busy = _waiting.get((id(state), id(loop), key))
    if blocking and busy and (deadline is None or deadline > loop.time()):
        return await _wait_in_turn(state, key, owner, limit, ttl, deadline)
    sent = loop.time()
    try:
        grant = await state.semaphore_acquire(key, owner, limit, ttl)
    except asyncio.CancelledError:
        # the try may have been granted, or may still be if it is on the wire: undo it before
        # the cancellation goes on, so no permit is left to a task that is gone
        await finish_despite_cancellation(state.semaphore_abandon(key, owner))
        raise
    except BaseException:
        run_in_background(state.semaphore_abandon(key, owner))
        raise
    if grant.token is not None or not blocking:
        return grant, sent
    if deadline is not None and loop.time() >= deadline:
        return grant, sent
    return await _wait_in_turn(state, key, owner, limit, ttl, deadline)


async def _wait_in_turn(
    state: SemaphoreState, key: str, owner: str, limit: int, ttl: float, deadline: float | None
) -> tuple[Grant, float]:
    loop = asyncio.get_running_loop()
    queued = won = False
    where = (id(state), id(loop), key)
    _waiting[where] = _waiting.get(where, 0) + 1
    try:
        async with state.semaphore_watch(key, owner) as watch:
            while True:
                watch.reset()
                sent = loop.time()
                queued = True
                grant = await state.semaphore_acquire(key, owner, limit, ttl, hold=PLACE_HOLD)
                if grant.token is not None:
                    won = True
                    return grant, sent
                wait = max(min(grant.retry_after or 0.0, PLACE_REFRESH), _MIN_WAIT)
                if deadline is not None:
                    left = deadline - loop.time()
                    if left <= 0:
                        return grant, sent
                    wait = min(wait, left)
                await watch.wait(wait)
    finally:
        left = _waiting[where] - 1
        if left:
            _waiting[where] = left
        else:
            del _waiting[where]
        if queued and not won:
            # Stop waiting: give the place up (waking whoever it made wait), and undo a grant
            # that may have landed just as we gave up. Waited for unless the state is failing.
            kind = sys.exc_info()[0]
            undo = state.semaphore_abandon(key, owner)
            if kind is None or kind is asyncio.CancelledError:
                await clean_up(undo, wait=True)
            else:
                run_in_background(undo)
