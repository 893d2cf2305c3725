"""The "granted" context of ``retry_on_lock_conflict(on_exhaustion="process_without_lock")``.

Inside one such call every :class:`AsyncLock` is entered without acquiring. A context variable
carries that, so it covers the call's task and the tasks it starts, and never leaks elsewhere.
The primitives read it; no backend imports this module.
"""

from __future__ import annotations

import contextvars

_granted: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "asynclock_granted", default=None
)


def granted_reason() -> str | None:
    """Why every AsyncLock entered in this context is granted without acquiring, if it is.

    Set only for the duration of one ``process_without_lock`` call, in that call's task and
    the tasks it starts (a context variable, so it never leaks to other tasks).
    """
    return _granted.get()


def grant_all(reason: str) -> contextvars.Token[str | None]:
    """Grant every AsyncLock entered in the current context from now on (see ``reset_grant``)."""
    return _granted.set(reason)


def reset_grant(token: contextvars.Token[str | None]) -> None:
    """Undo :func:`grant_all`."""
    _granted.reset(token)
