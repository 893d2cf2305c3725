"""Argument checks shared by every primitive, so every error message reads the same way."""

from __future__ import annotations

import math


def check_key(key: object, what: str = "key") -> str:
    """Return ``key`` if it is a non-empty ``str``; raise ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(key, str):
        raise TypeError(f"{what} must be a str, got {type(key).__name__} {key!r}")
    if not key:
        raise ValueError(f"{what} must be a non-empty string, got {key!r}")
    if "\x00" in key:
        # PostgreSQL text cannot hold NUL: refuse it everywhere, so a key that works in tests
        # on MemoryState works on every backend.
        raise ValueError(f"{what} must not contain NUL characters ('\\x00'), got {_short(key)}")
    if key.isascii():  # a flag of the string, no scan: nearly every key, and no surrogate
        return key
    try:
        key.encode("utf-8")
    except UnicodeEncodeError as exc:
        # a lone surrogate: no server can store it (and MemoryState should not pretend to)
        raise ValueError(
            f"{what} must be valid Unicode text (UTF-8 encodable), got {_short(key)}: "
            f"{exc.reason} at position {exc.start}"
        ) from None
    return key


def _short(text: str, limit: int = 200) -> str:
    """``repr(text)``, cut to about ``limit`` characters for an error message."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


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
    # the common cases first: every lock operation checks its durations on its hot path
    if value is None:
        if allow_none:
            return None
    elif type(value) is float and 0.0 < value < math.inf:
        return value
    where = f" (key {key!r})" if key is not None else ""
    if value is None:
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


#: the longest TTL (about 317 years): every backend can store an expiry this far ahead
#: (MySQL's DATETIME ends in 9999, PostgreSQL's interval and Redis's PX at about 2**63 units)
MAX_TTL = 1e10


def check_ttl(value: object, name: str = "ttl", *, key: str | None = None) -> float:
    """A TTL: finite, > 0, at least one millisecond (the servers' resolution), at most MAX_TTL."""
    if type(value) is float and 0.001 <= value <= MAX_TTL:
        return value  # the common case, checked on every acquire
    seconds = check_seconds(value, name, key=key)
    assert seconds is not None
    where = f" (key {key!r})" if key is not None else ""
    if seconds < 0.001:
        raise ValueError(
            f"{name} must be at least 0.001 seconds (servers keep milliseconds), "
            f"got {value!r}{where}"
        )
    if seconds > MAX_TTL:
        raise ValueError(
            f"{name} must be at most {MAX_TTL:.0e} seconds (about 317 years), got {value!r}{where}"
        )
    return seconds


def ttl_ms(seconds: float) -> int:
    """Seconds to whole milliseconds for a server call, never rounding a positive TTL to 0."""
    return max(1, round(seconds * 1000))


def check_limit(limit: object) -> int:
    """``limit`` (how many inbox entries a step may hand out) when it is an int >= 0.

    Raises:
        ValueError: ``limit`` is not an int, or is negative (the message shows it).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int >= 0, got {limit!r}")
    return limit


def check_permits(limit: object, *, key: str | None = None) -> int:
    """``limit`` (how many holders a semaphore admits at once) when it is an int >= 1.

    Raises:
        TypeError: ``limit`` is not an int (a bool is refused too).
        ValueError: ``limit`` is below 1 (the message shows it and the key).
    """
    where = f" (key {key!r})" if key is not None else ""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise TypeError(f"limit must be an int >= 1, got {type(limit).__name__} {limit!r}{where}")
    if limit < 1:
        raise ValueError(f"limit must be an int >= 1, got {limit!r}{where}")
    return limit


def check_inbox_finish(
    key: str,
    *,
    done: object,
    dead: str | None,
    retry_in: object,
    park: object,
) -> float | None:
    """Check how an inbox step finishes its entries (``inbox_step`` / ``inbox_take``): the
    ``retry_in`` (as ``float`` seconds, or ``None``) a backend then applies.

    The one place every backend calls, so the rules and their messages are the same everywhere:
    ``retry_in`` is finite seconds > 0 (at most :data:`MAX_TTL`) and needs ``done`` (the entry
    or entries that wait) without ``dead`` or ``park``; ``park`` is a bool and needs ``dead``
    and ``done``. ``done`` counts as given when it is an id or a non-empty collection of ids.

    Raises:
        TypeError: ``retry_in`` is not a number, or ``park`` not a bool (the message shows it).
        ValueError: a bad ``retry_in`` value, or a combination the rules refuse (the message
            names the values and the key).
    """
    if retry_in is None and park is False:
        return None  # the common case: every step of every drain
    if not isinstance(park, bool):
        raise TypeError(f"park must be True or False, got {park!r} (key {key!r})")
    given = done is not None and not (isinstance(done, (tuple, list, set, frozenset)) and not done)
    if park:
        if retry_in is not None:
            raise ValueError(
                f"retry_in and park exclude each other: got retry_in={retry_in!r} with "
                f"park=True (key {key!r})"
            )
        if dead is None or not given:
            raise ValueError(
                f"park=True needs done= (the entry) and dead= (its error), got done={done!r}, "
                f"dead={dead!r} (key {key!r})"
            )
        return None
    seconds = check_seconds(retry_in, "retry_in", key=key)
    assert seconds is not None
    if seconds > MAX_TTL:
        raise ValueError(
            f"retry_in must be at most {MAX_TTL:.0e} seconds, got {retry_in!r} (key {key!r})"
        )
    if dead is not None:
        raise ValueError(
            f"retry_in keeps the entry pending, dead= moves it to the dead letters: got "
            f"retry_in={retry_in!r} with dead={dead!r} (key {key!r})"
        )
    if not given:
        raise ValueError(
            f"retry_in needs done= (the entry that waits for its retry), got done={done!r} "
            f"(key {key!r})"
        )
    return seconds


def check_count(value: object, name: str) -> int:
    """``value`` (a count such as ``max_attempts``) when it is an int >= 1.

    Raises:
        TypeError: ``value`` is not an int (a bool is refused too).
        ValueError: ``value`` is below 1.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value
