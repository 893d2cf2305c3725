"""The route interface: how one event gets from its claim to its outcome.

``EventDispatcher`` picks one :class:`Route` at construction (:func:`pick_route`), per state
and policy:

* :class:`~asynclock._supersede.route.SupersedeRoute` under ``on_lock_conflict="supersede"``;
* :class:`~asynclock._dispatch.fast_route.FastRoute` on a state whose steps need no await
  (:class:`MemoryState`), for any other policy but ``concurrent``;
* :class:`~asynclock._dispatch.general_route.GeneralRoute` otherwise (the fast route hands it
  what it cannot serve itself).

The dispatcher does what every route shares around the call: the in-process duplicate check,
forgetting a claim that was not handled, marking a handled one done, and recording the outcome.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from asynclock._dispatch.backlog import Backlogs
from asynclock._dispatch.fast_route import FastRoute
from asynclock._dispatch.general_route import GeneralRoute
from asynclock._dispatch.policies import SUPERSEDE
from asynclock._supersede.route import SupersedeRoute
from asynclock.state._immediate import immediate_steps

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable

    from asynclock._dedupe.claim import EventClaim
    from asynclock._dispatch.context import DispatchContext
    from asynclock._events.event import Event, Outcome


class Route(Protocol):
    """One way of dispatching an event whose lock key and claim are known."""

    def route(
        self,
        event: Event,
        lock_key: str,
        claim: EventClaim | None,
        loop: asyncio.AbstractEventLoop,
        *,
        submitted: bool,
    ) -> Awaitable[Outcome]:
        """Claim (``claim``: the event's dedupe claim, ``None`` without a dedupe key), lock and
        handle ``event``, or apply the conflict policy; the outcome. ``submitted``: the caller
        of ``submit()`` has answered already (a policy function's ``drop`` is queued instead).

        Not necessarily a coroutine function: a route may return another route's awaitable
        (one frame less per event).
        """
        ...


def pick_route(context: DispatchContext) -> tuple[Route, SupersedeRoute | None]:
    """The route for ``context``'s state and policy, and the supersede route if it is that one
    (``accept()`` / ``serve()`` take their supersede parts from it)."""
    if context.policy == SUPERSEDE:
        superseding = SupersedeRoute(
            context.state,
            context.handlers,
            lock_ttl=context.lock_ttl,
            grace=context.supersede_grace,
            carry_ttl=context.dedupe_ttl,
            claim_alone=context.claim_alone,
            spawn=context.spawn,
        )
        return superseding, superseding
    backlogs = Backlogs(context)
    general = GeneralRoute(context, backlogs)
    #: the state's steps, if they need no await (MemoryState): the fast route
    lean = immediate_steps(context.state)
    if lean is not None and context.policy != "concurrent":
        return FastRoute(context, lean, general, backlogs), None
    return general, None
