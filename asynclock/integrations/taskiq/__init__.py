"""asynclock for taskiq: lock-aware retries, and middlewares that lock or dedupe tasks per key.

* :func:`retry_on_lock_conflict` (with :func:`check_tries`): a task that meets a lock busy is
  re-kicked with a delay through taskiq, instead of sleeping in the worker.
* :class:`LockMiddleware`: tasks that name a key in a label run one at a time per key, across
  workers; :func:`lock_token` gives the running task its fencing token.
* :class:`UniqueMiddleware`: a ``kiq`` whose key is held by a pending or running task is refused
  with :class:`TaskAlreadyQueuedError`.

Requires the ``taskiq`` extra: ``pip install 'asynclock[taskiq]'``.
"""

from __future__ import annotations

try:
    import taskiq  # noqa: F401 - only to name the extra when taskiq is missing
except ImportError as exc:  # pragma: no cover - exercised without the extra only
    raise ImportError(
        "asynclock.integrations.taskiq needs taskiq: pip install 'asynclock[taskiq]'"
    ) from exc

from asynclock.integrations.taskiq._lock_middleware import LockMiddleware, lock_token
from asynclock.integrations.taskiq._retry import check_tries, retry_on_lock_conflict
from asynclock.integrations.taskiq._unique_middleware import (
    TaskAlreadyQueuedError,
    UniqueMiddleware,
)

__all__ = (
    "LockMiddleware",
    "TaskAlreadyQueuedError",
    "UniqueMiddleware",
    "check_tries",
    "lock_token",
    "retry_on_lock_conflict",
)
