"""Driver errors become :class:`StateUnavailableError` at the edge, always."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from typing import TYPE_CHECKING

from asynclock._errors import StateUnavailableError

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextmanager
def map_driver_errors(
    unavailable: tuple[type[BaseException], ...], where: str, op_timeout: float | None
) -> Iterator[None]:
    """Translate ``unavailable`` driver errors (and our own deadline) into StateUnavailableError.

    ``where`` names the backend without secrets (a redacted URL); the driver's exception stays
    reachable as ``__cause__``.
    """
    try:
        yield
    except (TimeoutError, asyncio.TimeoutError) as exc:
        raise unavailable_error(exc, where, op_timeout) from exc
    except unavailable as exc:
        raise unavailable_error(exc, where, op_timeout) from exc


def unavailable_error(
    exc: BaseException, where: str, op_timeout: float | None
) -> StateUnavailableError:
    """The StateUnavailableError for driver error ``exc`` (chain it with ``from exc``).

    For hot paths that catch the driver errors themselves instead of entering
    :func:`map_driver_errors`.
    """
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return StateUnavailableError(f"{where} did not answer within op_timeout={op_timeout} s")
    return StateUnavailableError(f"{where} is unavailable: {type(exc).__name__}: {exc}")
