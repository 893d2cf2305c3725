"""Driver errors become :class:`StateUnavailableError` at the edge, always."""

from __future__ import annotations

import asyncio

from asynclock._errors import StateUnavailableError


def unavailable_error(
    exc: BaseException, where: str, op_timeout: float | None
) -> StateUnavailableError:
    """The StateUnavailableError for driver error ``exc`` (chain it with ``from exc``).

    :class:`~asynclock.state._guard.OperationGuard` raises it for every server state's
    operation.
    """
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return StateUnavailableError(f"{where} did not answer within op_timeout={op_timeout} s")
    return StateUnavailableError(f"{where} is unavailable: {type(exc).__name__}: {exc}")
