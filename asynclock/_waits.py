"""The one normalisation of a wait between executions: seconds, or ``executions -> seconds``.

Shared by ``retry_on_lock_conflict``'s ``wait`` (``_retry/retrying.py``) and the durable inbox's
``retry_wait`` (``_inbox/retry.py``), so both take the same forms with the same messages.
"""

from __future__ import annotations

import math
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["checked_wait", "wait_by_executions"]


def wait_by_executions(
    wait: float | Callable[[int], float],
    jitter: float,
    *,
    name: str,
    forms: str,
) -> tuple[Callable[[int], float], Callable[[int], float]]:
    """Normalise a wait given as seconds (plus up to ``jitter`` of itself, at random) or as a
    callable ``executions -> seconds`` (deterministic; its result checked on each call) to
    ``executions -> seconds``, with its deterministic lower bound.

    The one normalisation of ``retry_on_lock_conflict``'s ``wait`` and of the inbox's
    ``retry_wait`` (``EventDispatcher``), so both take the same forms with the same messages;
    ``name`` and ``forms`` (what the value may be) word the errors.

    Raises:
        TypeError: ``wait`` is neither a number nor a callable.
        ValueError: a number that is not finite or is negative.
    """
    if callable(wait):
        function = wait

        def computed(executions: int) -> float:
            return checked_wait(function(executions), executions, name)

        return computed, computed
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise TypeError(f"{name} must be {forms}, got {wait!r}")
    seconds = float(wait)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name} must be finite seconds >= 0, got {wait!r}")

    def fixed(executions: int) -> float:
        return seconds * (1.0 + jitter * random.random())

    return fixed, lambda executions: seconds


def checked_wait(value: object, executions: int, name: str = "wait") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}({executions}) must return seconds, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{name}({executions}) must return finite seconds >= 0, got {value!r}")
    return seconds
