"""The dashboard's ASGI application: its routes, and what each answers.

Routes, below the mount point:

* ``GET /``: the page, rendered with the current data (``?q=``, ``sort=``, ``kp=``, ``dp=``,
  ``lp=``: the view, see ``_views.py``).
* ``GET /api/refresh`` (same parameters): the page's fragments as JSON, for its script.
* ``GET /api/payload?key=K&id=N``: one dead letter's payload, only when asked for (and
  refused when the dashboard was built with ``payloads=False``).
* ``POST /api/requeue``, ``/api/discard``, ``/api/unlock`` (JSON ``{"key": ..., "token": ...}``):
  the actions, guarded (``_actions.py``); 403 unless ``allow_actions=True``.
* ``GET /static/dashboard.js`` and ``.css``: the page's script and style, shipped with the package.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import time
from typing import TYPE_CHECKING, final

from asynclock._errors import StateUnavailableError
from asynclock._validate import check_seconds
from asynclock.web._actions import ACTIONS, Guard, available, refused, run
from asynclock.web._html import dead_page_keys, fragments, page
from asynclock.web._http import (
    Request,
    Response,
    TooLarge,
    json_response,
    read_body,
    send_response,
    text_response,
)
from asynclock.web._reader import History, Reader, Reading
from asynclock.web._tables import Frame
from asynclock.web._views import View

if TYPE_CHECKING:
    from collections.abc import Collection

    from asynclock.state import State
    from asynclock.web._http import Receive, Scope, Send

__all__ = ("Dashboard",)

logger = logging.getLogger("asynclock")

#: the largest action body read (a key and a token)
_BODY_LIMIT = 16_384
_ASSETS = {
    "/static/dashboard.js": "text/javascript; charset=utf-8",
    "/static/dashboard.css": "text/css; charset=utf-8",
}


def _asset(path: str) -> bytes:
    return importlib.resources.files("asynclock.web").joinpath(path.lstrip("/")).read_bytes()


@final
class Dashboard:
    """The web dashboard of one state, as an ASGI application (see :func:`asynclock.web.dashboard`).

    Invariants: read-only unless built with ``allow_actions=True`` (every action is then
    refused with 403); an action also needs the page's CSRF token and a same-origin request;
    the state is read at most once per ``refresh * 0.75`` seconds whatever the number of open
    pages; a dead letter's payload is read only when a viewer asks for it; nothing the page
    loads comes from another origin. The dashboard never closes the state.
    """

    __slots__ = (
        "_actions",
        "_assets",
        "_guard",
        "_history",
        "_hosts",
        "_payloads",
        "_reader",
        "_refresh",
        "_version",
        "allow_actions",
        "state",
    )

    def __init__(
        self,
        state: State,
        *,
        allow_actions: bool = False,
        refresh: float = 2.0,
        history: float = 900.0,
        payloads: bool = True,
        origins: Collection[str] = (),
        hosts: Collection[str] | None = None,
    ) -> None:
        if not isinstance(allow_actions, bool):
            raise TypeError(f"allow_actions must be a bool, got {allow_actions!r}")
        if not isinstance(payloads, bool):
            raise TypeError(f"payloads must be a bool, got {payloads!r}")
        if isinstance(origins, str):
            raise TypeError(f"origins must be a collection of origins, got the str {origins!r}")
        if isinstance(hosts, str):
            raise TypeError(f"hosts must be a collection of host names, got the str {hosts!r}")
        refresh_seconds = check_seconds(refresh, "refresh")
        window = check_seconds(history, "history")
        assert refresh_seconds is not None
        assert window is not None
        if refresh_seconds < 0.2:
            raise ValueError(f"refresh must be at least 0.2 seconds, got {refresh!r}")
        self.state = state
        self.allow_actions = allow_actions
        self._refresh = refresh_seconds
        self._payloads = payloads
        self._hosts = None if hosts is None else frozenset(h.lower() for h in hosts)
        self._actions = available(state) if allow_actions else frozenset()
        self._guard = Guard(origins)
        self._history = History(window)
        self._reader = Reader(state, max_age=refresh_seconds * 0.75, history=self._history)
        self._assets = {path: _asset(path) for path in _ASSETS}
        digest = hashlib.sha256(b"".join(self._assets.values())).hexdigest()
        self._version = digest[:12]

    def __repr__(self) -> str:
        mode = "actions allowed" if self.allow_actions else "read-only"
        return f"<Dashboard of {self.state!r}, {mode}>"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI connection (``http``; ``lifespan`` is acknowledged)."""
        kind = scope.get("type")
        if kind == "lifespan":
            await _lifespan(receive, send)
            return
        if kind != "http":
            if kind == "websocket":
                await send({"type": "websocket.close", "code": 1003})
            return
        request = Request.from_scope(scope)
        try:
            response = await self._answer(request, receive)
        except StateUnavailableError as exc:
            response = json_response(503, {"error": f"the state is unavailable: {exc}"})
        except TooLarge as exc:
            response = json_response(413, {"error": str(exc)})
        await send_response(send, response, head=request.method == "HEAD")

    async def _answer(self, request: Request, receive: Receive) -> Response:
        host = request.headers.get("host", "").lower()
        if self._hosts is not None and host not in self._hosts:
            # a page of another site whose domain name was rebound to this address
            where = min(self._hosts)
            return text_response(421, f"this dashboard answers only at {where}\n")
        path, method = request.path or "/", request.method
        if path.startswith("/api/") and path[5:] in ACTIONS:
            if method != "POST":
                return _not_allowed("POST")
            return await self._act(path[5:], request, receive)
        if method not in ("GET", "HEAD"):
            return _not_allowed("GET, HEAD")
        if path == "/":
            return await self._page(request)
        if path == "/api/refresh":
            return await self._refreshed(request)
        if path == "/api/payload":
            return await self._payload(request)
        if path in _ASSETS:
            return Response(
                200,
                self._assets[path],
                _ASSETS[path],
                (("cache-control", "public, max-age=86400, immutable"),),
            )
        return json_response(404, {"error": f"no such page: {path}"})

    def _frame(self, request: Request) -> Frame:
        return Frame(
            root=request.root,
            title=repr(self.state),
            refresh=self._refresh,
            window=self._history.window,
            csrf=self._guard.token,
            actions=self._actions,
            payloads=self._payloads,
            version=self._version,
        )

    async def _parts(self, view: View, frame: Frame) -> dict[str, str]:
        """The page's fragments for ``view``: the shared reading, the page's dead letters."""
        reading = await self._reader.reading()
        letters = {}
        try:
            letters = await self._reader.dead_letters(dead_page_keys(reading.snapshot, view))
        except StateUnavailableError as exc:
            error = f"{type(exc).__name__}: {exc}"
            reading = Reading(reading.snapshot, error, time.time(), reading.interval)
        return fragments(reading, letters, self._history.samples(), view, frame)

    async def _page(self, request: Request) -> Response:
        view = View.from_query(request.query)
        frame = self._frame(request)
        html = page(await self._parts(view, frame), view, frame)
        return text_response(200, html, "text/html; charset=utf-8")

    async def _refreshed(self, request: Request) -> Response:
        view = View.from_query(request.query)
        parts = await self._parts(view, self._frame(request))
        return json_response(200, {"fragments": parts})

    async def _payload(self, request: Request) -> Response:
        if not self._payloads:
            return json_response(403, {"error": "payloads are turned off on this dashboard"})
        key, entry = request.query.get("key", ""), request.query.get("id", "")
        if not key or not entry.isdigit():
            return json_response(400, {"error": "expected ?key=KEY&id=N"})
        payload = await self._reader.payload(key, int(entry))
        if payload is None:
            return json_response(404, {"error": f"{key!r} has no dead letter #{entry}"})
        logger.info(
            "asynclock dashboard: payload of dead letter #%s of %r shown to %s",
            entry,
            key,
            request.who(),
            extra={"lock_key": key, "who": request.who()},
        )
        return json_response(200, {"key": key, "id": int(entry), "payload": payload})

    async def _act(self, action: str, request: Request, receive: Receive) -> Response:
        reason = (
            self._guard.refusal(request)
            if self.allow_actions
            else "this dashboard is read-only (start it with --allow-actions)"
        )
        if reason is not None:
            refused(action, request, reason)
            return json_response(403, {"error": f"refused: {reason}"})
        if action not in self._actions:
            return json_response(501, {"error": f"{type(self.state).__name__} cannot {action}"})
        body = await read_body(receive, _BODY_LIMIT)
        outcome = await run(self.state, action, body, request)
        self._reader.invalidate()
        key = "message" if outcome.status < 400 else "error"
        return json_response(outcome.status, {key: outcome.message, "count": outcome.count})


def _not_allowed(allowed: str) -> Response:
    response = json_response(405, {"error": f"method not allowed (allowed: {allowed})"})
    return Response(
        response.status,
        response.body,
        response.content_type,
        (
            *response.headers,
            ("allow", allowed),
        ),
    )


async def _lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge start-up and shut-down (the dashboard opens and closes nothing itself)."""
    while True:
        message = await receive()
        kind = message.get("type")
        if kind == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif kind == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
