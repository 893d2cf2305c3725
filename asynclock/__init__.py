"""asynclock: asyncio-native distributed locks, dedupe and lock-aware retries.

Everything public is importable from here. Server states load their drivers on first access,
so ``import asynclock`` needs none of them.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING

from asynclock._dedupe.deduper import Deduper as Deduper
from asynclock._dispatch.delivery import Delivery as Delivery
from asynclock._dispatch.dispatcher import EventDispatcher as EventDispatcher
from asynclock._dispatch.dispatcher import LockScope as LockScope
from asynclock._dispatch.policies import ConflictPolicy as ConflictPolicy
from asynclock._dispatch.policies import PolicyName as PolicyName
from asynclock._errors import AsynclockError as AsynclockError
from asynclock._errors import InboxFullError as InboxFullError
from asynclock._errors import LockAcquisitionError as LockAcquisitionError
from asynclock._errors import LockError as LockError
from asynclock._errors import LockLostError as LockLostError
from asynclock._errors import LockNotOwnedError as LockNotOwnedError
from asynclock._errors import StateError as StateError
from asynclock._errors import StateUnavailableError as StateUnavailableError
from asynclock._events.event import Event as Event
from asynclock._events.event import HandlerContext as HandlerContext
from asynclock._events.event import Outcome as Outcome
from asynclock._lock.lock import AsyncLock as AsyncLock
from asynclock._retry.decorator import RetryStatistics as RetryStatistics
from asynclock._retry.decorator import retry_on_lock_conflict as retry_on_lock_conflict
from asynclock._semaphore import Semaphore as Semaphore
from asynclock.state import state_from_url as state_from_url
from asynclock.state._backends import lazy as _lazy
from asynclock.state._protocol import LockInfo as LockInfo
from asynclock.state._protocol import State as State
from asynclock.state.memory import MemoryState as MemoryState

if TYPE_CHECKING:
    from asynclock.state.mysql import MySQLState as MySQLState
    from asynclock.state.postgres import PostgresState as PostgresState
    from asynclock.state.redis import RedisState as RedisState

__version__ = "0.1.0.dev0"

__all__ = (
    "AsyncLock",
    "AsynclockError",
    "ConflictPolicy",
    "Deduper",
    "Delivery",
    "Event",
    "EventDispatcher",
    "HandlerContext",
    "InboxFullError",
    "LockAcquisitionError",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockNotOwnedError",
    "LockScope",
    "MemoryState",
    "MySQLState",
    "Outcome",
    "PolicyName",
    "PostgresState",
    "RedisState",
    "RetryStatistics",
    "Semaphore",
    "State",
    "StateError",
    "StateUnavailableError",
    "retry_on_lock_conflict",
    "state_from_url",
)

# Public objects report the package as their home (error messages, docs, pickling); type
# aliases and the lazily imported states are left as they are.
for _name in __all__:
    if _lazy(_name) is None and _name not in (
        "ConflictPolicy",
        "LockScope",
        "PolicyName",
    ):
        globals()[_name].__module__ = __name__
del _name


def __getattr__(name: str) -> object:
    backend = _lazy(name)  # a server state: its module (and driver) loads on first use
    if backend is not None:
        try:
            module = _importlib.import_module(backend.module)
        except ImportError as exc:
            raise ImportError(
                f"asynclock.{name} needs its driver: pip install 'asynclock[{backend.extra}]' "
                f"({exc})"
            ) from exc
        obj: type = getattr(module, name)
        obj.__module__ = __name__
        globals()[name] = obj
        return obj
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
