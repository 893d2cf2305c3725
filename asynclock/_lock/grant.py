"""The "granted" context of ``retry_on_lock_conflict(on_exhaustion="process_without_lock")``.

Inside one such call every :class:`AsyncLock` is entered without acquiring. A context variable
carries that, so it covers the call's task and the tasks it starts, and never leaks elsewhere.
The primitives read it; no backend imports this module.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

#: the reason of the current ``process_without_lock`` call, if there is one
granted: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "asynclock_granted", default=None
)

#: ``granted_reason()``: why every AsyncLock entered in this context is granted without
#: acquiring, if it is (``None``: it is not). Set only for the duration of one
#: ``process_without_lock`` call, in that call's task and the tasks it starts. The context
#: variable's own ``get``, without a Python frame: the lock and the dispatcher read it on every
#: acquire and event.
granted_reason: Callable[[], str | None] = granted.get


def grant_all(reason: str) -> contextvars.Token[str | None]:
    """Grant every AsyncLock entered in the current context from now on (see ``reset_grant``)."""
    return granted.set(reason)


def reset_grant(token: contextvars.Token[str | None]) -> None:
    """Undo :func:`grant_all`."""
    granted.reset(token)
