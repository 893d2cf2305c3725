"""Owner ids: who holds a lock, unique per acquisition.

An owner id reads ``"<host>:<pid>:<task id>:<random>"``. The random part comes from
:mod:`secrets`, so ids are unguessable and never repeat; the rest tells an operator at 3 a.m.
which machine, process and task holds a lock. Ids are made fresh for every acquisition and
belong to the acquiring task: two tasks never share one (unlike redis-py's ``threading.local``
token, which every task of an event loop shares).
"""

from __future__ import annotations

import asyncio
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
