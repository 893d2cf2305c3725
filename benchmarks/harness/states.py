"""asynclock states as a user builds them from a URL, for the scenarios and their children."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks.harness.env import Asynclock

#: state class of each backend, by the name ``asynclock`` exports it under
STATE_CLASSES = {"postgres": "PostgresState", "mysql": "MySQLState", "redis": "RedisState"}


def open_state(api: Asynclock, backend: str, url: str, prefix: str, **options: Any) -> Any:
    """``<Backend>State.from_url(url, prefix=prefix, **options)``: as a user builds it."""
    return getattr(api.module, STATE_CLASSES[backend]).from_url(url, prefix=prefix, **options)


async def warm_state(state: Any, key: str) -> None:
    """Open the state's connections, schema and (PostgreSQL) LISTEN connection before timing.

    ``watch()`` is the State protocol's wake-up subscription; PostgresState connects its
    listener on the first one, which would otherwise land in the first timed cross-process wait.
    """
    async with state.watch(key):
        pass
