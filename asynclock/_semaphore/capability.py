"""The semaphore capability of a state, checked once per state class at construction."""

from __future__ import annotations

from typing import cast

from asynclock.state._protocol import SemaphoreState

__all__ = ["semaphore_state"]

#: per state class: whether it has every SemaphoreState method (a runtime-checkable protocol's
#: isinstance walks them all, which would cost more than a MemoryState acquire)
_capable: dict[type, bool] = {}


def semaphore_state(state: object) -> SemaphoreState:
    """``state`` as a :class:`~asynclock.state.SemaphoreState`.

    Raises:
        TypeError: ``state`` lacks the capability (the message names its class).
    """
    kind = type(state)
    capable = _capable.get(kind)
    if capable is None:
        capable = _capable[kind] = isinstance(state, SemaphoreState)
    if not capable:
        raise TypeError(
            f"Semaphore needs a state with the SemaphoreState capability (semaphore_acquire, "
            f"semaphore_release, ...); {kind.__name__} does not have it: use MemoryState, "
            "RedisState, PostgresState or MySQLState, or implement it (docs: Custom backends)"
        )
    return cast("SemaphoreState", state)
