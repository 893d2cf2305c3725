"""Argument checks shared by every primitive, so every error message reads the same way."""

from __future__ import annotations

import math


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a non-empty ``str``; raise ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__} {key!r}")
    if not key:
        raise ValueError(f"{what} must be a non-empty string, got {key!r}")
    return key


def check_seconds(
    value: object,
    name: str,
    *,
    key: str | None = None,
    allow_zero: bool = False,
    allow_none: bool = False,
) -> float | None:
    """Validate a duration in seconds and return it as ``float``.

    Rejects booleans, non-numbers, NaN, infinity and negatives (and zero unless ``allow_zero``),
    with a message that names the parameter, the bad value and, when given, the key.
    """
    where = f" (key {key!r})" if key is not None else ""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be a number of seconds, got None{where}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{name} must be a number of seconds, got {type(value).__name__} {value!r}{where}"
        )
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}{where}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}{where}")
    return seconds


def check_ttl(value: object, name: str = "ttl", *, key: str | None = None) -> float:
    """A TTL: finite, > 0, at least one millisecond (the servers' resolution)."""
    seconds = check_seconds(value, name, key=key)
    assert seconds is not None
    if seconds < 0.001:
        where = f" (key {key!r})" if key is not None else ""
        raise ValueError(
            f"{name} must be at least 0.001 seconds (servers keep milliseconds), "
            f"got {value!r}{where}"
        )
    return seconds


def ttl_ms(seconds: float) -> int:
    """Seconds to whole milliseconds for a server call, never rounding a positive TTL to 0."""
    return max(1, round(seconds * 1000))
