"""State backends: where locks and dedupe records live.

``MemoryState`` needs nothing; the server states import their drivers on first use, so
``import asynclock`` works without redis-py, asyncpg or aiomysql installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from asynclock.state._backends import lazy
from asynclock.state._protocol import (
    ClaimingState,
    DedupeReading,
    DurabilityCheck,
    FairState,
    Grant,
    InboxState,
    InboxWorker,
    LockAdmin,
    LockInfo,
    Release,
    SemaphoreInfo,
    SemaphoreState,
    State,
    SupersedeSignals,
    SupersedeWatch,
    Watch,
)
from asynclock.state._url import SCHEMES, StateURL, backend_class, register_scheme
from asynclock.state.memory import MemoryState

if TYPE_CHECKING:
    from asynclock.state.mysql import MySQLState
    from asynclock.state.postgres import PostgresState
    from asynclock.state.redis import RedisState

__all__ = (
    "SCHEMES",
    "ClaimingState",
    "DedupeReading",
    "DurabilityCheck",
    "FairState",
    "Grant",
    "InboxState",
    "InboxWorker",
    "LockAdmin",
    "LockInfo",
    "MemoryState",
    "MySQLState",
    "PostgresState",
    "RedisState",
    "Release",
    "SemaphoreInfo",
    "SemaphoreState",
    "State",
    "StateURL",
    "SupersedeSignals",
    "SupersedeWatch",
    "Watch",
    "register_scheme",
    "state_from_url",
)


def state_from_url(url: str, **options: object) -> State:
    """Build the state that serves ``url``, chosen by its scheme.

    The schemes (the backend table, :data:`asynclock.state._backends.BACKENDS`): ``memory://`` gives a
    :class:`MemoryState`; ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://`` and
    ``redis+sentinel://`` a :class:`RedisState`; ``postgresql://`` and ``postgres://`` a
    :class:`PostgresState`; ``mysql://`` a :class:`MySQLState`. ``options`` go to the class's
    ``from_url`` (e.g. ``prefix=``).

    Raises:
        ValueError: the scheme is unknown (the message lists the known ones).
        ImportError: the backend's driver is not installed (the message names the extra).

    Example:
        >>> import asynclock
        >>> asynclock.state_from_url("memory://")
        <MemoryState locks=0 dedupe=0>
    """
    cls = backend_class(url)
    from_url = getattr(cls, "from_url")  # noqa: B009 - every backend class has from_url
    state: State = from_url(url, **options)
    return state


def __getattr__(name: str) -> object:
    backend = lazy(name)  # a server state: its module (and driver) loads on first use
    if backend is not None:
        cls: type[State] = getattr(importlib.import_module(backend.module), backend.name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
