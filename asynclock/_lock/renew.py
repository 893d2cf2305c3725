"""The auto-renew task of ``AsyncLock(auto_renew=True)``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from asynclock import metrics as _metrics
from asynclock._compat import deadline_at
from asynclock._errors import StateUnavailableError
from asynclock._timers import Timer, call_after, first_renewal
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock.state._protocol import State


class Renewed(Protocol):
    """What a renewer reads and updates of the acquisition it renews (the engine's ``Ticket``,
    which imports this module: hence a protocol, not the class)."""

    owner: str
    expires: float


class Renewer:
    """Extends a held lock every ``ttl/3`` until stopped; reports a loss through ``on_lost``.

    Starts its task only when the first renewal is due (see :mod:`asynclock._timers`).

    Invariants: renewals never push the lock past ``max_lifetime`` seconds after the renewer
    started; a renewal that cannot reach the state is retried (sooner) until the lock's expected
    expiry, and reported lost at that expiry (an unanswered renewal is not waited for past it);
    after ``on_lost`` the task ends.
    """

    __slots__ = (
        "_extend",
        "_key",
        "_max_lifetime",
        "_on_lost",
        "_started",
        "_state",
        "_task",
        "_ticket",
        "_timer",
        "_ttl",
    )

    def __init__(
        self,
        state: State,
        key: str,
        ticket: Renewed,
        ttl: float,
        max_lifetime: float | None,
        on_lost: Callable[[str], None],
        *,
        started: float | None = None,
        extend: Callable[[str, str, float], Awaitable[bool]] | None = None,
    ) -> None:
        """``extend(key, owner, ttl)``: the renewal step, ``state.extend`` by default (a
        :class:`~asynclock.Semaphore` renews its permit with ``semaphore_extend``)."""
        self._state = state
        self._extend = extend if extend is not None else state.extend
        self._key = key
        self._ticket = ticket
        self._ttl = ttl
        self._max_lifetime = max_lifetime
        self._on_lost = on_lost
        self._task: asyncio.Task[None] | None = None
        self._timer: Timer | None = None
        #: held since then (``started``: the lock was taken before this renewer, e.g. handed
        #: over by the state, by the lean path, or by the engine's own timer): the schedule
        #: counts from there
        self._started = asyncio.get_running_loop().time() if started is None else started
        # Lazy: nothing but a cheap timer exists until the first renewal (or the max_lifetime
        # cap) is due, so a body shorter than ttl/3 costs no task, which is nearly every one.
        self._timer = call_after(started, first_renewal(ttl, max_lifetime), self._start)

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"asynclock-renew {self._key!r}"
        )

    def stop(self) -> None:
        """Stop renewing (the lock is being released)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._ttl / 3
        started = self._started
        end_of_life = started + self._max_lifetime if self._max_lifetime is not None else None
        next_at = started + interval
        while True:
            now = loop.time()
            if end_of_life is not None and end_of_life <= next_at:
                # the cap comes first: hold until it, then give the body up
                await asyncio.sleep(max(end_of_life - now, 0.0))
                self._on_lost(f"max_lifetime={self._max_lifetime} s passed")
                return
            await asyncio.sleep(max(next_at - now, 0.0))
            ttl = self._ttl
            if end_of_life is not None:
                ttl = min(ttl, max(end_of_life - loop.time(), 0.001))
            sent = loop.time()
            try:
                # never wait for an answer past the lock's expected expiry: with an op_timeout
                # longer than what is left of the TTL, a stalled renewal would let the body run
                # on after the lock expired and another holder took it
                async with deadline_at(self._ticket.expires):
                    extended = await self._extend(self._key, self._ticket.owner, ttl)
            except (StateUnavailableError, TimeoutError, asyncio.TimeoutError) as exc:
                if loop.time() >= self._ticket.expires:
                    self._on_lost(f"the state was unreachable until the TTL ran out: {exc!r}")
                    return
                next_at = loop.time() + min(interval, (self._ticket.expires - loop.time()) / 3)
                continue
            if not extended:
                self._on_lost("a renewal found the lock expired or taken over")
                return
            self._ticket.expires = sent + ttl
            next_at = sent + interval
            if active.sink is not None:
                _metrics.report("lock_renewed", self._key)
