"""The conflict policies: their names, and the answer a policy function gives per conflict.

``on_lock_conflict`` is a name (``drop``, ``force``, ``queue``, ``latest``, ``debounce``,
``concurrent``, or the dispatcher-wide ``supersede``) or a function ``(thread_key, event) ->
name`` asked each time a key is busy (:func:`conflict_policy`).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Literal, cast

from asynclock._events.event import Event

logger = logging.getLogger("asynclock")

PolicyName = Literal["drop", "force", "queue", "latest", "debounce", "concurrent"]
POLICIES: tuple[PolicyName, ...] = ("drop", "force", "queue", "latest", "debounce", "concurrent")
#: a dispatcher-wide policy only (not one a policy function may pick per conflict: the holder
#: must have subscribed to the key's supersede signals before it took the lock)
SUPERSEDE: Literal["supersede"] = "supersede"
#: a policy name, or a (sync or async) function of (thread_key, event) returning one, per conflict
ConflictPolicy = (
    PolicyName | Literal["supersede"] | Callable[[str, Event], "PolicyName | Awaitable[PolicyName]"]
)


def check_policy(policy: object) -> None:
    """Refuse an ``on_lock_conflict`` that is neither a policy name nor a function."""
    if not callable(policy) and policy not in POLICIES and policy != SUPERSEDE:
        raise ValueError(
            f"on_lock_conflict must be one of {', '.join((*POLICIES, SUPERSEDE))} or a "
            f"function (thread_key, event) -> name, got {policy!r}"
        )


async def conflict_policy(
    policy: ConflictPolicy, lock_key: str, event: Event, *, submitted: bool
) -> PolicyName:
    """The policy for ``event`` on busy ``lock_key``: ``policy`` itself, or its function's answer.

    A function that picks ``drop`` for a submitted event has it queued instead (logged): the
    caller of ``submit()`` has answered already, so a drop could not be redelivered.

    Raises:
        ValueError: the function returned something other than a policy name.
    """
    if isinstance(policy, str):
        assert policy != SUPERSEDE  # never asked: supersede routes apart (_supersede/route.py)
        return policy
    chosen = policy(lock_key, event)
    if inspect.isawaitable(chosen):
        chosen = await chosen
    if chosen not in POLICIES:
        raise ValueError(
            f"on_lock_conflict function {name(policy)} returned {chosen!r} for "
            f"{lock_key!r}; expected one of {', '.join(POLICIES)}"
        )
    if chosen == "drop" and submitted:
        # the caller of submit() has answered already: a drop could not be redelivered
        logger.warning(
            "asynclock: on_lock_conflict function %s chose 'drop' for submitted event %s of "
            "%r; it is queued instead (a submitted event cannot be answered 'dropped')",
            name(policy),
            event.message_id,
            lock_key,
            extra={"lock_key": lock_key, "message_id": event.message_id},
        )
        return "queue"
    return chosen


def name(function: object) -> str:
    """A policy function's name for messages (its ``__qualname__``, else its repr)."""
    return cast("str", getattr(function, "__qualname__", None) or repr(function))
