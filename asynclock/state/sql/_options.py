"""The options every SQL state takes, and the checks of its ``from_url`` pool options."""

from __future__ import annotations

from typing import TypedDict

from asynclock._validate import check_seconds

__all__ = ["DEFAULT_OP_TIMEOUT", "SQLOptions", "check_connect_options", "check_max_connections"]

#: seconds one operation may take unless ``op_timeout`` says otherwise
DEFAULT_OP_TIMEOUT = 5.0


class SQLOptions(TypedDict, total=False):
    """The options every SQL state takes (see :class:`~asynclock.state.sql._state.SQLState`
    for their meaning)."""

    prefix: str
    table_prefix: str
    op_timeout: float
    create_schema: bool
    token_retention: float
    reservation: float
    purge_interval: float | None


def check_max_connections(max_connections: object) -> int:
    """A pool size: an ``int`` of at least 1."""
    if not isinstance(max_connections, int) or max_connections < 1:
        raise ValueError(f"max_connections must be an int >= 1, got {max_connections!r}")
    return max_connections


def check_connect_options(connect_timeout: object, max_connections: object) -> float:
    """Validate ``from_url``'s pool options; return ``connect_timeout`` in seconds."""
    connect = check_seconds(connect_timeout, "connect_timeout")
    assert connect is not None
    check_max_connections(max_connections)
    return connect
