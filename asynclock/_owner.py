"""Owner ids: who holds a lock, unique per acquisition.

An owner id reads ``"<host>:<pid>:<task id>:<random>"``. The random part comes from
:mod:`secrets`, so ids are unguessable and never repeat; the rest tells an operator at 3 a.m.
which machine, process and task holds a lock. Ids are made fresh for every acquisition and
belong to the acquiring task: two tasks never share one (unlike redis-py's ``threading.local``
token, which every task of an event loop shares).
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import re
import secrets
import socket

# The Redis scripts split lock values on " " and "|"; keep those out of ids.
_HOST = re.sub(r"[\s|]", "_", socket.gethostname()) or "localhost"
_prefix = f"{_HOST}:{os.getpid()}"


def _after_fork() -> None:
    global _prefix
    _prefix = f"{_HOST}:{os.getpid()}"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def new_owner() -> str:
    """A fresh owner id for the current task: ``"<host>:<pid>:<task id>:<random>"``."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    task_id = f"{id(task):x}" if task is not None else "0"
    return f"{_prefix}:{task_id}:{secrets.token_hex(8)}"


def new_process_id() -> str:
    """An id for one state instance in this process: ``"<host>:<pid>:<random>"``."""
    return f"{_prefix}:{secrets.token_hex(4)}"


# -- the "granted" context of retry_on_lock_conflict(on_exhaustion="process_without_lock") ------

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
