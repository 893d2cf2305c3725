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
import threading

# The Redis scripts split lock values on " " and "|"; keep those out of ids.
_HOST = re.sub(r"[\s|]", "_", socket.gethostname()) or "localhost"
_prefix = f"{_HOST}:{os.getpid()}"


#: random parts drawn ahead, 16 hex digits each: one ``os.urandom`` call per _BATCH ids instead
#: of one per acquisition (the syscall was a tenth of an uncontended MemoryState pair)
_BATCH = 256
_random_parts: list[str] = []
_refill = threading.Lock()


def _random_part() -> str:
    try:
        return _random_parts.pop()  # atomic: threads never get the same part
    except IndexError:
        with _refill:
            if not _random_parts:
                drawn = secrets.token_hex(8 * _BATCH)
                _random_parts.extend(drawn[i : i + 16] for i in range(0, len(drawn), 16))
        return _random_part()  # other threads may have drained the new batch already


def _after_fork() -> None:
    global _prefix, _refill
    _refill = threading.Lock()  # another thread may have held it at the fork
    _prefix = f"{_HOST}:{os.getpid()}"
    # the parent's parts, if inherited, would repeat its future ids in the child
    _random_parts.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def new_owner(task: asyncio.Task[object] | None = None) -> str:
    """A fresh owner id for the current task: ``"<host>:<pid>:<task id>:<random>"``.

    ``task``: the current task, when the caller has it at hand already.
    """
    global _recent
    if task is None:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
    if task is None:
        return f"{_prefix}:0:{_random_part()}"
    recent = _recent
    task_id = id(task)
    if recent is None or recent[0] != task_id or recent[1] != _prefix:
        # one task acquiring lock after lock formats its part once (the prefix changes on
        # fork). Keyed by the id alone, no weak reference (a third of a miss, as in a burst
        # of one task per event): a later task with the same id has the same part anyway
        recent = _recent = (task_id, _prefix, f"{_prefix}:{task_id:x}:")
    return recent[2] + _random_part()


#: the last task's id and its ``"<host>:<pid>:<task id>:"``, with the prefix it was made from
_recent: tuple[int, str, str] | None = None


def new_handout_owner() -> str:
    """A fresh owner id for a lock that a state hands out to a worker it does not know yet (the
    inbox's hand-out on Redis): ``"inbox-handout:<random>"``; the worker that takes the grant
    drains the key under this id."""
    return f"inbox-handout:{_random_part()}"


def new_process_id() -> str:
    """An id for one state instance in this process: ``"<host>:<pid>:<random>"``."""
    return f"{_prefix}:{secrets.token_hex(4)}"


def owner_parts(owner: str) -> tuple[str, str]:
    """``(host, pid)`` of an owner id ``"<host>:<pid>:<task>:<random>"``, for operators' tools.

    Best effort: an id of another shape (a custom owner) comes back whole, with ``"?"`` as pid.

    Example:
        >>> owner_parts("vm:2932:7f160691bd00:9fb8e92294cb7c01")
        ('vm', '2932')
        >>> owner_parts("someone")
        ('someone', '?')
    """
    parts = owner.rsplit(":", 3)
    if len(parts) == 4:
        return parts[0], parts[1]
    return owner, "?"
