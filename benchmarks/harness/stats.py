"""Small statistics and number formatting helpers shared by the scenarios."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

NAN = math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return NAN
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    """Median, minimum and maximum of one metric over the rounds."""

    median: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        finite = [v for v in values if not math.isnan(v)]
        if not finite:
            return cls(NAN, NAN, NAN, 0)
        return cls(statistics.median(finite), min(finite), max(finite), len(finite))


def fmt(value: float, digits: int) -> str:
    """A number with thousands separators and ``digits`` decimals; ``n/a`` for NaN."""
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf"
    return f"{value:,.{digits}f}"


def fmt_spread(spread: Spread, digits: int) -> str:
    """``median (min-max)``, or just the median when every round agreed."""
    if spread.count == 0:
        return "n/a"
    med = fmt(spread.median, digits)
    low, high = fmt(spread.low, digits), fmt(spread.high, digits)
    if spread.count == 1 or low == high == med:
        return med
    return f"{med} ({low}\u2013{high})"
