"""Hostile input for the bad-input tests (issue #7): Hypothesis strategies and the expectations.

Every value either works or raises a ``ValueError``/``TypeError`` whose message names it. The
``expected_*`` functions say which, from the documented rules (``asynclock._validate``), so a
test can check both directions: a valid value that raises is as much a bug as a bad value that
is accepted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hypothesis import strategies as st

if TYPE_CHECKING:
    from collections.abc import Callable

#: the longest TTL every backend stores (``asynclock._validate.MAX_TTL``)
MAX_TTL = 1e10

SPECIAL_KEYS: tuple[str, ...] = (
    "",
    " ",
    "  leading and trailing  ",
    "\t\n\r\x0b\x0c",
    "\x00",
    "a\x00b",
    "\ud800",
    "lone \udfff surrogate",
    "é",
    "Ελληνικά",
    "日本語のキー",
    "🎉👩‍👩‍👧",
    "\u200b\ufeff\u202e",
    "x" * 10_240,
    "é" * 5_000,
    "'",
    '"',
    'it\'s "quoted"',
    "; DROP TABLE x; --",
    "'; DROP TABLE asynclock_locks; --",
    '"); DROP TABLE asynclock_dedupe; --',
    "1' OR '1'='1",
    "{",
    "}",
    "{}",
    "{tag}rest",
    "a}b{c",
    "{{{}}}",
    "%s",
    "%(owner)s",
    "$1",
    "?",
    "%",
    "_",
    "*",
    "[a-z]*",
    "\\",
    "\\x00",
    ":",
    "::",
    "key:released",
    "asynclock:",
    "|",
    "a b|c d",
    "\n-- name --\n",
)

#: characters that mean something to a shell, SQL, Lua patterns, Redis hash tags or LIKE
_NASTY = "{}'\";%_\\-:|*?[]$() \t\n\x00\u00e9\U0001f389"


def keys() -> st.SearchStrategy[str]:
    """Hostile lock keys and event ids: the specials, nasty alphabets, random text, long text."""
    return st.one_of(
        st.sampled_from(SPECIAL_KEYS),
        st.text(alphabet=st.sampled_from(_NASTY), max_size=24),
        st.text(max_size=40),
        st.builds(lambda text, n: (text or "k") * n, st.text(max_size=8), st.integers(1, 1500)),
        st.builds(lambda a, b: f"{a}\ud800{b}", st.text(max_size=5), st.text(max_size=5)),
    )


def non_str_keys() -> st.SearchStrategy[object]:
    """Keys of the wrong type."""
    return st.one_of(
        st.none(),
        st.integers(),
        st.floats(allow_nan=False),
        st.binary(max_size=8),
        st.lists(st.text(max_size=3), max_size=2),
        st.just(("a", "b")),
    )


def key_is_valid(key: object) -> bool:
    """Whether ``key`` must be accepted: a non-empty UTF-8 encodable str without NUL."""
    if not isinstance(key, str) or not key or "\x00" in key:
        return False
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


SPECIAL_SECONDS: tuple[object, ...] = (
    0,
    0.0,
    -0.0,
    -1,
    -1e-9,
    math.nan,
    math.inf,
    -math.inf,
    1e-6,
    0.0005,
    0.001,
    0.01,
    1,
    30.0,
    1e9,
    1e10,
    1e10 + 1,
    1e11,
    1e300,
    2**70,
    True,
    False,
    "1",
    "30",
    "",
    None,
    b"1",
    [1.0],
    {"ttl": 1},
    1j,
)


def seconds() -> st.SearchStrategy[object]:
    """TTLs and timeouts: specials, any float, ints, and things that are not numbers."""
    return st.one_of(
        st.sampled_from(SPECIAL_SECONDS),
        st.floats(),
        st.floats(min_value=0.001, max_value=120.0),
        st.integers(min_value=-(2**65), max_value=2**65),
        st.text(max_size=4),
        st.booleans(),
    )


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def ttl_is_valid(value: object) -> bool:
    """A TTL must be a real number (not a bool), finite, 0.001 <= ttl <= MAX_TTL."""
    if not is_number(value):
        return False
    seconds = float(value)  # type: ignore[arg-type]
    return math.isfinite(seconds) and 0.001 <= seconds <= MAX_TTL


def timeout_is_valid(value: object, *, allow_none: bool = True) -> bool:
    """A timeout: ``None`` (no limit) or a finite number >= 0 (not a bool)."""
    if value is None:
        return allow_none
    if not is_number(value):
        return False
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return False
    return math.isfinite(seconds) and seconds >= 0


def error_kind(value: object, valid: Callable[[object], bool]) -> type[Exception] | None:
    """``None`` when ``value`` is valid, else the error type it must raise."""
    if valid(value):
        return None
    if is_number(value) or (isinstance(value, str) and valid is key_is_valid):
        return ValueError
    return TypeError


def names_value(message: str, value: object) -> bool:
    """Whether an error ``message`` names ``value`` (its repr, or the start of a long one)."""
    if isinstance(value, str):
        text = value[:40]
        forms = {repr(value), repr(text)[:-1], repr(text)[1:-1], text}
        return any(form and form in message for form in forms) or (
            not value and ("''" in message or '""' in message)
        )
    if isinstance(value, float) and math.isnan(value):
        return "nan" in message
    return repr(value) in message or type(value).__name__ in message
