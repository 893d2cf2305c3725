"""``asynclock locks`` and ``asynclock unlock``: see who holds what, and free a stuck key."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from asynclock._owner import owner_parts
from asynclock.state import state_from_url
from asynclock.state._protocol import LockAdmin, LockInfo

if TYPE_CHECKING:
    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")

__all__ = ("format_locks", "held_locks", "open_state", "unlock")


def open_state(url: str, prefix: str | None) -> State:
    """The state at ``url``; ``prefix`` is passed to server states (memory has none)."""
    options: dict[str, object] = {}
    if prefix is not None and not url.startswith("memory:"):
        options["prefix"] = prefix
    return state_from_url(url, **options)


def _admin(state: State) -> LockAdmin:
    if not isinstance(state, LockAdmin):
        raise NotImplementedError(f"{type(state).__name__} cannot list or force-release locks")
    return state


async def held_locks(state: State, match: str = "*") -> list[LockInfo]:
    """Every lock held now on ``state`` whose key matches the glob ``match``, by key."""
    found = [info async for info in _admin(state).held_locks(match)]
    return sorted(found, key=lambda info: info.key)


async def unlock(state: State, key: str) -> LockInfo | None:
    """Force-release ``key``; returns the holder it had (logged), or ``None``."""
    info = await _admin(state).force_release(key)
    if info is not None:
        logger.warning(
            "asynclock: lock %r force-released from %s (token %d)",
            key,
            info.owner,
            info.token,
            extra={"lock_key": key, "owner": info.owner, "token": info.token},
        )
    return info


def format_locks(infos: list[LockInfo], *, as_json: bool = False) -> str:
    """A table (or JSON lines) of ``infos``: key, host, pid, seconds left, token, owner."""
    rows = []
    for info in infos:
        host, pid = owner_parts(info.owner)
        rows.append(
            {
                "key": info.key,
                "host": host,
                "pid": pid,
                "seconds_left": round(info.remaining, 3),
                "token": info.token,
                "owner": info.owner,
            }
        )
    if as_json:
        return json.dumps(rows, indent=2) + "\n"
    if not rows:
        return "no locks held\n"
    columns = ("key", "host", "pid", "seconds_left", "token", "owner")
    cells = [[str(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


def print_locks(infos: list[LockInfo]) -> bool:
    """Print ``infos`` as a rich table when rich is installed and stdout is a terminal.

    Returns ``False`` (printing nothing) otherwise, so the caller prints the plain table.
    """
    import sys

    if not sys.stdout.isatty():
        return False
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        return False
    table = Table("key", "host", "pid", "seconds left", "token", "owner", title="locks held")
    for info in infos:
        host, pid = owner_parts(info.owner)
        table.add_row(info.key, host, pid, f"{info.remaining:.3f}", str(info.token), info.owner)
    Console().print(table)
    return True
