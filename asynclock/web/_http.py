"""The little of ASGI the dashboard needs: a request read from its scope, a response sent back.

The dashboard is a plain ASGI application, so mounting it costs the host application no
dependency and no version constraint (a FastAPI app pins its own Starlette). This module is the
whole of its HTTP layer: the request's method, path below the mount point, query, headers and
client, its body (bounded), and a response with the headers every answer carries.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

__all__ = (
    "Receive",
    "Request",
    "Response",
    "Scope",
    "Send",
    "TooLarge",
    "json_response",
    "read_body",
    "send_response",
    "text_response",
)

#: an ASGI scope or message (the values are whatever the server put there)
Scope = MutableMapping[str, object]
Receive = Callable[[], Awaitable[MutableMapping[str, object]]]
Send = Callable[[MutableMapping[str, object]], Awaitable[None]]

#: on every answer: nothing of the page runs in a frame of another site, no MIME sniffing, the
#: Referer only to this origin, and scripts, styles and requests from this origin only
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    (
        "content-security-policy",
        (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
            "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "same-origin"),
    ("x-frame-options", "DENY"),
)


class TooLarge(Exception):
    """A request body over the limit (answered 413)."""


@dataclass(frozen=True, slots=True)
class Request:
    """What the dashboard reads of one HTTP request.

    ``path`` is below the mount point: ``""`` or starting with ``/`` (Starlette's ``Mount`` and
    uvicorn's ``--root-path`` put the mount point in ``root_path`` and leave it in ``path``);
    ``root`` is the mount point, without a trailing slash, for the links the page makes.
    ``headers`` has lower-case names (the first of repeated ones); ``query`` the first value of
    each parameter.
    """

    method: str
    path: str
    root: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    scheme: str
    client: str | None
    user: str | None

    @classmethod
    def from_scope(cls, scope: Scope) -> Request:
        """The request of an ``http`` scope."""
        root = str(scope.get("root_path") or "").rstrip("/")
        path = str(scope.get("path") or "")
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root) :]
        raw_query = scope.get("query_string") or b""
        query: dict[str, str] = {}
        if isinstance(raw_query, bytes):
            for name, value in parse_qsl(raw_query.decode("latin-1"), keep_blank_values=True):
                query.setdefault(name, value)
        headers: dict[str, str] = {}
        raw_headers = scope.get("headers") or ()
        if isinstance(raw_headers, (list, tuple)):
            for pair in raw_headers:
                name, value = pair
                headers.setdefault(
                    bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1")
                )
        return cls(
            method=str(scope.get("method") or "GET").upper(),
            path=path,
            root=root,
            query=query,
            headers=headers,
            scheme=str(scope.get("scheme") or "http"),
            client=_client(scope.get("client")),
            user=_user(scope.get("user")),
        )

    def who(self) -> str:
        """Who sent it, for the log: the client's address and, if the host app set one, its user."""
        where = self.client or "an unknown client"
        return f"{self.user} at {where}" if self.user else where


def _client(value: object) -> str | None:
    """``host:port`` of the scope's ``client`` (``None`` when the server did not say)."""
    if isinstance(value, (list, tuple)) and len(value) == 2:
        host, port = value
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return None


def _user(value: object) -> str | None:
    """The authenticated user the host app put in ``scope["user"]``, by name.

    Starlette's ``AuthenticationMiddleware`` puts a user object there (``is_authenticated``,
    ``display_name``); a plain string is taken as the name. An unauthenticated user is nobody.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if getattr(value, "is_authenticated", True) is False:
        return None
    for attribute in ("display_name", "username", "identity", "name"):
        name = getattr(value, attribute, None)
        if isinstance(name, str) and name:
            return name
    return str(value)


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request's body; :class:`TooLarge` past ``limit`` bytes (read no further)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            break
        chunk = message.get("body") or b""
        if isinstance(chunk, bytes):
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"the body is over {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: status, body, its content type and extra headers."""

    status: int
    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()


def text_response(
    status: int, text: str, content_type: str = "text/plain; charset=utf-8"
) -> Response:
    """A text answer (HTML when ``content_type`` says so), never cached."""
    return Response(status, text.encode(), content_type, (("cache-control", "no-store"),))


def json_response(status: int, data: Mapping[str, object]) -> Response:
    """A JSON answer, never cached (it carries the state's keys, maybe a payload)."""
    body = json.dumps(data, separators=(",", ":")).encode()
    return Response(status, body, "application/json", (("cache-control", "no-store"),))


async def send_response(send: Send, response: Response, *, head: bool = False) -> None:
    """Send ``response`` (its headers only for a ``HEAD`` request)."""
    headers = [
        (b"content-type", response.content_type.encode()),
        (b"content-length", str(len(response.body)).encode()),
    ]
    headers += [(name.encode(), value.encode()) for name, value in SECURITY_HEADERS]
    headers += [(name.encode(), value.encode()) for name, value in response.headers]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else response.body})
