"""What one viewer looks at: the filter, the sort order and the page of each table.

The view lives in the page's query string (``?q=ig:&sort=age&kp=2``), so a reload or a link
shows the same thing. Bad values fall back to the defaults: a view never fails a request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Generic, TypeVar
from urllib.parse import urlencode

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from asynclock.web._snapshot import KeyRow, LockRow

__all__ = (
    "DEAD_KEYS_PER_PAGE",
    "KEYS_PER_PAGE",
    "LETTERS_PER_KEY",
    "LOCKS_PER_PAGE",
    "SORTS",
    "Page",
    "View",
    "page_of",
)

KEYS_PER_PAGE = 50
#: dead letters are grouped by key; a page shows this many keys...
DEAD_KEYS_PER_PAGE = 10
#: ...and this many letters of each (the oldest: the first a requeue puts back)
LETTERS_PER_KEY = 5
LOCKS_PER_PAGE = 50
#: the orders of the keys table: the oldest work first (the default), the deepest, by name, the
#: most dead letters
SORTS: dict[str, Callable[[KeyRow], tuple[float, str]]] = {
    "age": lambda row: (-row.oldest_age, row.key),
    "pending": lambda row: (-row.pending, row.key),
    "dead": lambda row: (-row.dead, row.key),
    "key": lambda row: (0.0, row.key),
}
_MAX_FILTER = 200

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a table: its rows, its number (from 1), how many pages and rows in all."""

    rows: tuple[T, ...]
    number: int
    pages: int
    total: int


def page_of(rows: Sequence[T], number: int, size: int) -> Page[T]:
    """Page ``number`` of ``rows`` (clamped to the last page, so a shrinking table never shows
    an empty page past its end)."""
    pages = max(1, math.ceil(len(rows) / size))
    number = min(max(number, 1), pages)
    start = (number - 1) * size
    return Page(tuple(rows[start : start + size]), number, pages, len(rows))


def _page_number(text: str | None) -> int:
    if text is None or not text.isdigit() or len(text) > 9:
        return 1
    return max(int(text), 1)


@dataclass(frozen=True, slots=True)
class View:
    """A viewer's filter (a case-insensitive part of the key), sort and pages."""

    q: str = ""
    sort: str = "age"
    keys_page: int = 1
    dead_page: int = 1
    locks_page: int = 1

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> View:
        """The view of a query string's parameters (``q``, ``sort``, ``kp``, ``dp``, ``lp``)."""
        sort = query.get("sort", "age")
        return cls(
            q=query.get("q", "").strip()[:_MAX_FILTER],
            sort=sort if sort in SORTS else "age",
            keys_page=_page_number(query.get("kp")),
            dead_page=_page_number(query.get("dp")),
            locks_page=_page_number(query.get("lp")),
        )

    def query(self) -> str:
        """This view's query string, defaults left out."""
        view = self
        pairs = {
            "q": view.q,
            "sort": "" if view.sort == "age" else view.sort,
            "kp": "" if view.keys_page == 1 else str(view.keys_page),
            "dp": "" if view.dead_page == 1 else str(view.dead_page),
            "lp": "" if view.locks_page == 1 else str(view.locks_page),
        }
        return urlencode({name: value for name, value in pairs.items() if value})

    def paged(self, table: str, number: int) -> View:
        """This view on page ``number`` of ``table`` (``kp``, ``dp`` or ``lp``)."""
        if table == "kp":
            return replace(self, keys_page=number)
        if table == "dp":
            return replace(self, dead_page=number)
        return replace(self, locks_page=number)

    def matches(self, text: str) -> bool:
        """``text`` contains the filter (case-insensitive); everything does with no filter."""
        return not self.q or self.q.lower() in text.lower()

    def keys(self, rows: Sequence[KeyRow]) -> Page[KeyRow]:
        """The page of keys with work to show: filtered, sorted, paged."""
        chosen = sorted((r for r in rows if self.matches(r.key)), key=SORTS[self.sort])
        return page_of(chosen, self.keys_page, KEYS_PER_PAGE)

    def dead_keys(self, rows: Sequence[KeyRow]) -> Page[KeyRow]:
        """The page of keys with dead letters to show: the most dead letters first."""
        chosen = sorted((r for r in rows if self.matches(r.key)), key=SORTS["dead"])
        return page_of(chosen, self.dead_page, DEAD_KEYS_PER_PAGE)

    def locks(self, rows: Sequence[LockRow]) -> Page[LockRow]:
        """The page of locks to show: filtered by key or owner, by key."""
        chosen = sorted(
            (r for r in rows if self.matches(r.key) or self.matches(r.owner)),
            key=lambda row: row.key,
        )
        return page_of(chosen, self.locks_page, LOCKS_PER_PAGE)
