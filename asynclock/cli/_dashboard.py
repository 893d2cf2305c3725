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

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ("is_loopback", "loopback_hosts", "serve_dashboard")

logger = logging.getLogger("asynclock")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_hosts(port: int) -> frozenset[str]:
    """The ``Host`` headers a browser sends to a loopback address at ``port``."""
    names = ("127.0.0.1", "localhost", "[::1]")
    return frozenset([f"{name}:{port}" for name in names] + ([*names] if port == 80 else []))


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
    numbers = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, _ignore) for number in numbers}
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
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    local = is_loopback(host)
    async with open_state(url, prefix) as state:
        app = dashboard(
            state,
            allow_actions=allow_actions,
            refresh=refresh,
            payloads=payloads,
            hosts=loopback_hosts(port) if local else None,
        )
        # a wrong URL or a server that is down fails here, at once, not in the first page
        await state.inspect("asynclock-dashboard:probe")
        config = uvicorn.Config(
            app,
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
        if not local:
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
