"""``asynclock dashboard``: the web dashboard (:mod:`asynclock.web`) served by uvicorn.

Safe by default: it binds 127.0.0.1, is read-only unless ``--allow-actions``, and while bound
to a loopback address it answers only requests addressed to a loopback name (``Host:
127.0.0.1:8765``, ``localhost``, ``[::1]``), so a web page that rebinds its own domain name
to 127.0.0.1 cannot read it. Bound elsewhere it warns: it has no login of its own.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING

from asynclock.cli._admin import open_state
from asynclock.state import StateURL
from asynclock.web import dashboard
from asynclock.web._http import Request, send_response, text_response
from asynclock.web._snapshot import read_snapshot

if TYPE_CHECKING:
    from collections.abc import Iterator

    from asynclock.web._http import App, Receive, Scope, Send

__all__ = ("LoopbackHosts", "is_loopback", "serve_dashboard")

logger = logging.getLogger("asynclock")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class LoopbackHosts:
    """An ASGI wrapper that answers only requests whose ``Host`` is a loopback name.

    A DNS-rebinding page (``evil.example`` resolved to 127.0.0.1) sends ``Host:
    evil.example``: refused with 421 before the dashboard sees it.
    """

    def __init__(self, app: App, port: int) -> None:
        self._app = app
        names = ("127.0.0.1", "localhost", "[::1]")
        self.allowed = frozenset(
            [f"{name}:{port}" for name in names] + ([*names] if port == 80 else [])
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or refuse it for its ``Host``."""
        if scope.get("type") == "http":
            host = Request.from_scope(scope).headers.get("host", "").lower()
            if host not in self.allowed:
                response = text_response(
                    421, f"this dashboard answers only at {min(self.allowed)}\n"
                )
                await send_response(send, response)
                return
        await self._app(scope, receive, send)


def _ignore(number: int, frame: object) -> None:
    """A signal handler that does nothing (see :func:`_quiet_signals`)."""


@contextlib.contextmanager
def _quiet_signals() -> Iterator[None]:
    """Let a SIGINT/SIGTERM that uvicorn caught end the command quietly.

    uvicorn shuts down on the signal, then sends it again to the handler it found installed:
    the default one would interrupt the state's clean close with a traceback (SIGINT) or kill the
    process (SIGTERM). While it serves, the handlers it finds are no-ops; ours come back after.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        number: signal.signal(number, _ignore) for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


async def serve_dashboard(
    url: str,
    prefix: str | None,
    *,
    host: str,
    port: int,
    allow_actions: bool,
    refresh: float,
    payloads: bool,
) -> int:
    """Serve the dashboard of the state at ``url`` until SIGINT/SIGTERM; the exit code."""
    try:
        import uvicorn
    except ImportError as exc:
        raise ImportError(
            "asynclock dashboard serves with uvicorn: pip install 'asynclock[web]'"
        ) from exc
    if not logging.getLogger("asynclock").handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    async with open_state(url, prefix) as state:
        app = dashboard(state, allow_actions=allow_actions, refresh=refresh, payloads=payloads)
        await read_snapshot(state)  # a wrong URL or a server that is down fails here, at once
        served: App = LoopbackHosts(app, port) if is_loopback(host) else app
        config = uvicorn.Config(
            served,
            host=host,
            port=port,
            lifespan="off",
            log_level="warning",
            access_log=False,
            server_header=False,
        )
        where = f"http://{'[' + host + ']' if ':' in host else host}:{port}/"
        mode = "actions allowed" if allow_actions else "read-only"
        print(f"asynclock dashboard: {where} ({mode}) for {StateURL(url)}", file=sys.stderr)
        if not is_loopback(host):
            print(
                f"asynclock dashboard: warning: listening on {host}, not loopback, with no login: "
                "whoever reaches this port sees every key"
                + (" and can requeue, discard and unlock" if allow_actions else "")
                + ". Mount asynclock.web.dashboard behind your app's authentication instead.",
                file=sys.stderr,
            )
        with _quiet_signals():
            await uvicorn.Server(config).serve()
    return 0
