"""The dashboard's actions (requeue, discard, force-unlock) and what guards them.

An action runs only when all of these hold, else it is refused (403) and the refusal logged:

* the dashboard was built with ``allow_actions=True``;
* the request is a ``POST`` of JSON carrying the dashboard's CSRF token in ``X-CSRF-Token``
  (the token is in the page; another site can neither read it nor send that header without a
  CORS preflight, which this app never answers);
* its ``Origin`` (or, without one, its ``Referer``) is this dashboard's own host or one of the
  ``origins`` it was given: a forged cross-site ``POST`` fails here even with a stolen token.

Every action is logged on the ``asynclock`` logger with who asked (the client's address and the
user the host app authenticated, if any) and what it did.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from asynclock._validate import check_key
from asynclock.state import LockAdmin
from asynclock.state._protocol import InboxState

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection

    from asynclock.state import State
    from asynclock.web._http import Request

__all__ = ("ACTIONS", "Guard", "Outcome", "available", "refused", "run")

logger = logging.getLogger("asynclock")

ACTIONS = ("requeue", "discard", "unlock")
#: the header that carries the CSRF token
TOKEN_HEADER = "x-csrf-token"


def available(state: State) -> frozenset[str]:
    """The actions ``state`` can do: requeue with an inbox, discard when it has
    ``inbox_discard``, unlock with the ``LockAdmin`` capability."""
    found = set()
    if isinstance(state, InboxState):
        found.add("requeue")
        if callable(getattr(state, "inbox_discard", None)):
            found.add("discard")
    if isinstance(state, LockAdmin):
        found.add("unlock")
    return frozenset(found)


def _netloc(origin: str) -> str:
    """``host[:port]`` of an origin or URL, lower-case (``""`` when it has none)."""
    try:
        return (urlsplit(origin).netloc or "").lower()
    except ValueError:
        return ""


class Guard:
    """The CSRF token of one dashboard, and the checks of a request that wants to act.

    The token is random per dashboard (a restart makes a new one: an open page then needs a
    reload, which it says).
    """

    def __init__(self, origins: Collection[str] = ()) -> None:
        self.token = secrets.token_urlsafe(32)
        self._origins = frozenset(_netloc(o) for o in origins if _netloc(o))

    def refusal(self, request: Request) -> str | None:
        """Why ``request`` may not act (``None``: it may)."""
        given = request.headers.get(TOKEN_HEADER, "")
        if not given:
            return "no CSRF token (the X-CSRF-Token header)"
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return "a wrong CSRF token (reload the page: the dashboard may have restarted)"
        source = request.headers.get("origin") or request.headers.get("referer")
        if not source or source == "null":
            return "no Origin or Referer header to check"
        host = request.headers.get("host", "").lower()
        where = _netloc(source)
        if not where or (where != host and where not in self._origins):
            return f"a request from another origin ({source!r}, this dashboard is {host!r})"
        if not request.headers.get("content-type", "").startswith("application/json"):
            return "a body that is not JSON"
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an action did: an HTTP status and a sentence for the page (and the log)."""

    status: int
    message: str
    count: int = 0


def _key(body: object) -> str:
    if not isinstance(body, dict):
        raise TypeError("the body must be a JSON object with a 'key'")
    return check_key(body.get("key"))


async def _requeue(state: State, key: str, body: dict[str, object]) -> Outcome:
    assert isinstance(state, InboxState)
    moved = await state.inbox_requeue(key)
    return Outcome(200, f"requeued {moved} dead letter(s) of {key!r}", moved)


async def _discard(state: State, key: str, body: dict[str, object]) -> Outcome:
    discard: Callable[[str], Awaitable[int]] = getattr(state, "inbox_discard")  # noqa: B009
    deleted = await discard(key)
    return Outcome(200, f"discarded {deleted} dead letter(s) of {key!r}", deleted)


async def _unlock(state: State, key: str, body: dict[str, object]) -> Outcome:
    """Force-release ``key``, but only from the holder the operator saw (``token``, when given):
    a lock that changed hands since is left alone (409)."""
    assert isinstance(state, LockAdmin)
    expected = body.get("token")
    if expected is not None:
        if isinstance(expected, str) and expected.isdigit():
            expected = int(expected)
        if not isinstance(expected, int) or isinstance(expected, bool):
            return Outcome(400, f"bad request: token must be an integer, got {expected!r}")
        held = await state.inspect(key)
        if held is None:
            return Outcome(404, f"{key!r} is not held any more")
        if held.token != expected:
            return Outcome(
                409,
                f"{key!r} changed hands (token {held.token}, not {expected}): "
                "look again and confirm again",
            )
    released = await state.force_release(key)
    if released is None:
        return Outcome(404, f"{key!r} is not held any more")
    return Outcome(200, f"force-released {key!r} from {released.owner} (token {released.token})", 1)


_RUN: dict[str, Callable[[State, str, dict[str, object]], Awaitable[Outcome]]] = {
    "requeue": _requeue,
    "discard": _discard,
    "unlock": _unlock,
}


async def run(state: State, action: str, raw: bytes, request: Request) -> Outcome:
    """Run ``action`` with the request's JSON body ``raw`` (already guarded); log it."""
    try:
        body = json.loads(raw or b"null")
        key = _key(body)
    except (ValueError, TypeError) as exc:
        return Outcome(400, f"bad request: {exc}")
    assert isinstance(body, dict)
    outcome = await _RUN[action](state, key, body)
    logger.warning(
        "asynclock dashboard: %s by %s: %s",
        action,
        request.who(),
        outcome.message,
        extra={"action": action, "lock_key": key, "who": request.who(), "status": outcome.status},
    )
    return outcome


def refused(action: str, request: Request, reason: str) -> None:
    """Log a refused action (who asked, and why it was refused)."""
    logger.warning(
        "asynclock dashboard: refused %s by %s: %s",
        action,
        request.who(),
        reason,
        extra={"action": action, "who": request.who(), "status": 403},
    )
