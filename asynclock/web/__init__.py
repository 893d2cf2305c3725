"""A web dashboard of the durable inbox, its dead letters and the locks held (SPEC section 13).

:func:`dashboard` returns a plain ASGI application: mount it in a FastAPI or Starlette app, behind
the app's own authentication, or run it alone with ``asynclock dashboard --state URL`` (which
needs uvicorn: ``pip install 'asynclock[web]'``). The application itself needs nothing beyond
asynclock; the page is server-rendered HTML with a small script of its own, and loads nothing
from any other origin.

Example:
    >>> from asynclock import MemoryState
    >>> from asynclock.web import dashboard
    >>> app = dashboard(MemoryState())          # app.mount("/ops/asynclock", app) in FastAPI
    >>> app
    <Dashboard of <MemoryState locks=0 dedupe=0>, read-only>

Layout: ``_app`` (routes), ``_http`` (the ASGI request and response), ``_snapshot`` (what is read
from the state), ``_reader`` (one read per refresh for every viewer, and the history),
``_views`` (filter, sort, pages), ``_html`` / ``_tables`` / ``_chart`` (the page),
``_actions`` (requeue, discard, unlock and their CSRF and origin checks), ``static/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock.web._app import Dashboard

if TYPE_CHECKING:
    from collections.abc import Collection

    from asynclock.state import State

__all__ = ("Dashboard", "dashboard")

Dashboard.__module__ = "asynclock.web"


def dashboard(
    state: State,
    *,
    allow_actions: bool = False,
    refresh: float = 2.0,
    history: float = 900.0,
    payloads: bool = True,
    origins: Collection[str] = (),
    hosts: Collection[str] | None = None,
) -> Dashboard:
    """The web dashboard of ``state`` as an ASGI application.

    The page shows the keys with work (pending events, oldest age and, where the state reports
    them, the holder and its attempt, a retry's due time, a parked flag), the deployment's depth
    and lag over the last ``history`` seconds, the dead letters (error, attempts, when) and the
    locks held (owner, seconds left, token), refreshed every ``refresh`` seconds while a page
    is open. Hundreds or thousands of keys stay usable: oldest first, paged, filtered by key.

    It never closes ``state``: the application that owns the state does. Mount it where only
    operators reach it (it has no login of its own; the host app's authentication applies, and
    the user it sets in ``scope["user"]`` is named in the action log).

    Args:
        state: the state to show (any built-in state; a custom one shows what its capabilities
            allow: ``InboxState`` for the inbox, ``LockAdmin`` for the locks).
        allow_actions: offer requeue and discard of a key's dead letters and force-unlock of a
            lock, each confirmed in the page and logged on the ``asynclock`` logger with who
            asked. ``False`` (the default): read-only, every action refused with 403.
        refresh: seconds between two refreshes of an open page (at least 0.2). The state is
            read at most once per ``0.75 * refresh`` seconds, however many pages are open.
        history: seconds of depth and lag the chart keeps (in this process's memory).
        payloads: ``False`` refuses to show dead letters' payloads at all (they may hold
            personal data); ``True`` shows one only when a viewer clicks for it.
        origins: more origins allowed to post actions (e.g. ``"https://ops.example.com"``
            when a proxy rewrites the ``Host`` header); the dashboard's own host always is.
        hosts: answer only requests whose ``Host`` header is one of these (``host:port``), 421
            to the others: what ``asynclock dashboard`` does on loopback against DNS
            rebinding. ``None`` (the default): any (your app's own host checks apply).

    Returns:
        The ASGI application (``app.mount("/asynclock", dashboard(state))``).

    Raises:
        TypeError: a flag that is not a bool, or ``origins`` or ``hosts`` given as one string.
        ValueError: ``refresh`` or ``history`` not a positive number of seconds.
    """
    return Dashboard(
        state,
        allow_actions=allow_actions,
        refresh=refresh,
        history=history,
        payloads=payloads,
        origins=origins,
        hosts=hosts,
    )
