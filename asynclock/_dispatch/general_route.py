"""The general route: claim the event, lock its key (the lock's engine), or apply the policy.

Every state takes it (the fast route of ``fast_route.py`` hands it what it cannot serve). Per
event: the claim (recorded on the lock's first server attempt on a :class:`ClaimingState`, by a
call of its own otherwise), the event's place among this process's events of the key, taken on
arrival, one try for the lock, and, if the key is busy, the conflict policy (``policies.py``):
``queue`` waits in the key's line, ``drop`` answers at once, ``force`` / ``concurrent`` run
without the lock, ``latest`` / ``debounce`` join the key's backlog (``backlog.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from asynclock._cancel import finish_despite_cancellation
from asynclock._dispatch.policies import conflict_policy
from asynclock._events.event import HandlerContext, Outcome
from asynclock._events.handlers import call_all
from asynclock._lock.acquisition import Acquisition, Place
from asynclock._lock.grant import granted_reason
from asynclock._validate import check_key

if TYPE_CHECKING:
    from asynclock._dedupe.claim import EventClaim
    from asynclock._dispatch.backlog import Backlogs
    from asynclock._dispatch.context import DispatchContext
    from asynclock._events.event import Event
    from asynclock._events.handlers import Registered

logger = logging.getLogger("asynclock")

# Enum members on the hot path as module constants: each ``Outcome.X`` is an enum descriptor
# lookup (0.2 µs), several per dispatched event.
_HANDLED, _DUPLICATE, _DROPPED = Outcome.HANDLED, Outcome.DUPLICATE, Outcome.DROPPED


class GeneralRoute:
    """The :class:`~asynclock._dispatch.route.Route` of every state and policy (``supersede``
    aside): the lock's engine per event (a :class:`Place` in the key's line), its conflict
    policy when the key is busy."""

    __slots__ = ("backlogs", "context")

    def __init__(self, context: DispatchContext, backlogs: Backlogs) -> None:
        self.context = context
        self.backlogs = backlogs

    async def route(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
        *,
        submitted: bool,
        placed: Place | None = None,
    ) -> Outcome:
        """Lock and handle ``event``, or apply the conflict policy; ``placed``: a lock whose
        place in the key's line was taken already (handed over by the fast route)."""
        context = self.context
        handlers = context.handlers.for_type(event.type)
        if context.policy == "concurrent" or granted_reason() is not None:
            # no lock to take (concurrent), or every AsyncLock is granted without touching the
            # state (inside process_without_lock): the claim is recorded on its own
            if claim is not None and not await context.claim_alone(claim):
                return _DUPLICATE
            if context.policy == "concurrent":
                await call_all(handlers, event, HandlerContext(lock_key))
                return _HANDLED
            granted = Acquisition(context.state, check_key(lock_key), context.lock_ttl)
            await granted.acquire()
            await self.under_lock(granted, handlers, event, claim)
            return _HANDLED
        if placed is not None:
            lock = placed
        else:
            lock = Place(context.state, check_key(lock_key), context.lock_ttl, auto_renew=True)
            # the event's place among this process's events of the key is taken now, on
            # arrival: nothing awaited below lets a later event overtake it
            lock.take_place()
        try:
            if claim is not None:
                if context.claiming is not None:
                    # only the line's member asks the state now; a waiter's claim is recorded on
                    # its own below, so a waiter promoted later must not claim again with its lock
                    if lock.first_in_line() and not claim.recorded:
                        # (a lean queued event promoted to contend recorded its claim already)
                        claim.ride_on_acquire(lock, context.claiming, context.lock_ttl)
                elif not await context.claim_alone(claim):  # duplicates are found before locking
                    await lock.leave_place()
                    return _DUPLICATE
            acquired = await lock.try_from_place()
            if lock.refused:
                assert claim is not None
                claim.not_ours()
                return _DUPLICATE
            if claim is not None:
                if claim.recorded:
                    claim.keep(context.state, context.lock_ttl)  # waits or runs under a policy
                elif not acquired and context.policy == "drop" and context.reading is not None:
                    # an event behind another of this process, dropped whatever its record says:
                    # the record is read, not written. A claim recorded only to be forgotten
                    # would refuse, for that moment, another process's delivery of the event,
                    # the one about to take the free lock: with each delivery refused there or
                    # dropped here, nobody would handle the key until the platform redelivers
                    if await context.reading.dedupe_remaining(claim.key) is not None:
                        await lock.leave_place()
                        return _DUPLICATE
                elif not await context.claim_alone(claim):
                    # an event behind another of this process never reached the server: its
                    # claim is recorded on its own (and kept from here)
                    await lock.leave_place()
                    return _DUPLICATE
            if acquired:
                await self.under_lock(lock, handlers, event, claim)
                return _HANDLED
            policy = await conflict_policy(context.policy, lock_key, event, submitted=submitted)
            if policy == "queue":
                timeout = context.queue_timeout
                if not await lock.wait_turn(None if timeout is None else loop.time() + timeout):
                    return _DROPPED  # queue_timeout ran out
                await self.under_lock(lock, handlers, event, claim)
                return Outcome.QUEUED
            await lock.leave_place()
        except BaseException:
            await finish_despite_cancellation(lock.leave_place())
            raise
        if policy == "drop":
            context.freeing.holder_left(lock_key, lock.retry_after, context.lock_ttl)
            return _DROPPED
        if policy in ("force", "concurrent"):
            await call_all(handlers, event, HandlerContext(lock_key, forced=True))
            return Outcome.FORCED
        return await self.backlogs.join(event, lock_key, debounce=policy == "debounce")

    async def under_lock(
        self, lock: Acquisition, handlers: list[Registered], event: Event, claim: EventClaim | None
    ) -> None:
        """Run the handlers under ``lock`` (acquired or granted already), then release it.

        Once the handlers have returned, the event is handled, whatever the release then says:
        a release that fails (the state unreachable, the lock expired meanwhile) is logged, the
        lock expires by its TTL, and the claim is marked done by a call of its own. Reporting
        it failed would make the platform redeliver an event whose effects already happened.
        """
        context = self.context
        handled = False
        # `async with lock.holding():` spelled out (lock.exit never swallows), which spares
        # the holding object and two coroutines per event
        lock.check_held()
        lock.start_holding()
        try:
            try:
                if claim is not None:
                    claim.keep(context.state, context.lock_ttl)
                loop = asyncio.get_running_loop()
                began = loop.time()
                await call_all(handlers, event, HandlerContext(lock.key, lock.token))
                handled = True
                context.freeing.observe(lock.key, loop.time() - began)
                if claim is not None:
                    claim.handled_now()
                    if context.claiming is not None:  # the release marks it done too
                        await claim.settle_in_release(lock, context.claiming, context.done_ttl)
            except BaseException as body_error:
                await lock.exit(type(body_error), body_error)
                raise
            await lock.exit(None, None)
        except Exception as error:
            if not handled:
                raise
            release_failed(event, lock.key, claim, error)
        except BaseException:
            if handled and claim is not None:
                claim.release_failed()
            raise


def release_failed(event: Event, lock_key: str, claim: EventClaim | None, error: Exception) -> None:
    """The handlers returned, then the lock's release failed: the event stays handled."""
    if claim is not None:
        claim.release_failed()  # so the done mark is written by a call of its own
    logger.warning(
        "asynclock: event %s handled, but releasing lock %r failed (%s: %s); the lock "
        "expires by its TTL",
        event.message_id,
        lock_key,
        type(error).__name__,
        error,
        extra={"lock_key": lock_key, "message_id": event.message_id},
    )
