"""The depth and lag chart: two small SVG line charts drawn on the server from the history.

Drawn here, not in the browser, so the page's script only swaps fragments; the SVG uses
presentation attributes and classes (the page's CSP allows no inline style).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from asynclock.web._reader import Sample

__all__ = ("chart", "duration")

WIDTH = 360
HEIGHT = 90
#: room for the labels above and below the plot
TOP, BOTTOM = 16, 14


def duration(seconds: float) -> str:
    """A short human duration: ``0.4 s``, ``12 s``, ``3 m 12 s``, ``2 h 5 m``, ``3 d 4 h``."""
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} m {secs} s" if secs else f"{minutes} m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} m" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _ceiling(value: float) -> float:
    """A round number at least ``value`` (1, 2, 5 times a power of ten) for the y axis."""
    if value <= 0:
        return 1.0
    step = 1.0
    while step * 10 <= value:
        step *= 10
    while step > value * 10:
        step /= 10
    for factor in (1, 2, 5, 10):
        if step * factor >= value:
            return step * factor
    return step * 10


def _panel(
    samples: Sequence[Sample],
    value: Callable[[Sample], float],
    *,
    title: str,
    label: Callable[[float], str],
    css: str,
    now: float,
    window: float,
) -> str:
    """One line chart of ``value`` over the last ``window`` seconds."""
    top = max(_ceiling(max((value(s) for s in samples), default=0.0)), 1.0)
    plot = HEIGHT - TOP - BOTTOM
    points = []
    for sample in samples:
        x = WIDTH * (1 - (now - sample.at) / window)
        y = TOP + plot * (1 - value(sample) / top)
        points.append(f"{max(x, 0.0):.1f},{y:.1f}")
    latest = label(value(samples[-1])) if samples else "-"
    name = html.escape(title)
    base = HEIGHT - BOTTOM
    span = html.escape(duration(window))
    body = [
        (
            f'<svg class="chart {css}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{name} over the last {html.escape(duration(window))}: now {latest}">'
        ),
        f'<text class="chart-title" x="0" y="11">{name}: <tspan class="now">{latest}</tspan></text>',
        f'<text class="chart-axis" x="{WIDTH}" y="11" text-anchor="end">max {label(top)}</text>',
        f'<line class="chart-base" x1="0" y1="{base}" x2="{WIDTH}" y2="{base}"/>',
        f'<line class="chart-grid" x1="0" y1="{TOP}" x2="{WIDTH}" y2="{TOP}"/>',
    ]
    if len(points) > 1:
        body.append(f'<polyline class="chart-line" points="{" ".join(points)}"/>')
    elif points:
        cx, cy = points[0].split(",")
        body.append(f'<circle class="chart-dot" cx="{cx}" cy="{cy}" r="2"/>')
    body += [
        f'<text class="chart-axis" x="0" y="{HEIGHT - 2}">{span} ago</text>',
        f'<text class="chart-axis" x="{WIDTH}" y="{HEIGHT - 2}" text-anchor="end">now</text>',
        "</svg>",
    ]
    return "".join(body)


def chart(samples: Sequence[Sample], *, now: float, window: float) -> str:
    """The two panels (pending events, oldest age) over the last ``window`` seconds."""
    shown = [s for s in samples if s.at >= now - window]
    note = ""
    if len(shown) < 2:
        note = (
            '<p class="note">The chart fills while this dashboard is open: it keeps the last '
            f"{html.escape(duration(window))} of refreshes in memory.</p>"
        )
    depth = _panel(
        shown,
        lambda s: float(s.pending),
        title="pending events",
        label=lambda v: f"{v:,.0f}",
        css="depth",
        now=now,
        window=window,
    )
    lag = _panel(
        shown,
        lambda s: s.lag,
        title="oldest pending",
        label=duration,
        css="lag",
        now=now,
        window=window,
    )
    return f'<div class="charts">{depth}{lag}</div>{note}'
