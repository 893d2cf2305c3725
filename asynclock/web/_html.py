"""The page: its shell, the header with what an operator reads first, and its fragments.

The first answer is the whole page, rendered here with the current data (it reads without
JavaScript); each refresh then answers the same fragments, by element id, as JSON, and the
page's script swaps them in. One renderer for both, so the two can never disagree.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from asynclock.web._chart import chart, duration
from asynclock.web._tables import dead_table, escape, keys_table, locks_table, moment

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from asynclock.web._reader import Reading, Sample
    from asynclock.web._snapshot import DeadRow, Snapshot
    from asynclock.web._tables import Frame
    from asynclock.web._views import View

__all__ = ("dead_page_keys", "fragments", "page")


def _status(reading: Reading, frame: Frame) -> str:
    """When the data was read and how long that took; why the last read failed, if it did."""
    snapshot = reading.snapshot
    parts = []
    if reading.error is not None:
        since = moment(reading.error_at) if reading.error_at is not None else ""
        shown = f"showing the read of {moment(snapshot.at)}" if snapshot else "nothing read yet"
        parts.append(
            f'<div class="banner critical" role="alert"><strong>The state is not answering'
            f"</strong> ({since}): {escape(reading.error)}. {shown}.</div>"
        )
    if snapshot is not None:
        slow = ""
        if reading.interval > frame.refresh:
            slow = (
                f'; <span class="warn" title="a read is reused for five times as long as it took, '
                f'so the dashboard keeps the state busy a fifth of the time at most">read every '
                f"{duration(reading.interval)}</span>"
            )
        parts.append(
            f'<span class="read">read {moment(snapshot.at)} in '
            f"{snapshot.took * 1000:,.0f} ms{slow}</span>"
        )
    return "".join(parts)


def _card(label: str, value: str, css: str = "", note: str = "") -> str:
    extra = f'<span class="card-note">{note}</span>' if note else ""
    return (
        f'<div class="card {css}"><span class="card-label">{label}</span>'
        f'<span class="card-value">{value}</span>{extra}</div>'
    )


def _totals(snapshot: Snapshot | None) -> str:
    """The cards: keys with work, pending events, oldest age, retrying, parked, dead letters,
    locks held (retrying and parked only when the state reports them)."""
    if snapshot is None:
        return '<p class="note">Waiting for the first read of the state.</p>'
    work = snapshot.work
    pending = sum(row.pending for row in work)
    oldest = max((row.oldest_age for row in work), default=0.0)
    dead = sum(row.dead for row in snapshot.keys)
    dead_keys = len(snapshot.dead_keys)
    age_css = "critical" if oldest >= 600 else "warn" if oldest >= 60 else ""
    cards = [
        _card("keys with work", f"{len(work):,}"),
        _card("pending events", f"{pending:,}"),
        _card("oldest pending", duration(oldest) if pending else "-", age_css),
    ]
    if "retry" in snapshot.fields:
        retrying = sum(1 for row in work if row.retry_at is not None)
        cards.append(_card("retrying", f"{retrying:,}", "warn" if retrying else ""))
    if "parked" in snapshot.fields:
        parked = sum(1 for row in snapshot.keys if row.parked)
        cards.append(_card("parked keys", f"{parked:,}", "critical" if parked else ""))
    note = f"in {dead_keys:,} key{'s' if dead_keys != 1 else ''}" if dead else ""
    cards.append(_card("dead letters", f"{dead:,}", "critical" if dead else "", note))
    if snapshot.locks_listed:
        cards.append(_card("locks held", f"{len(snapshot.locks):,}"))
    return "".join(cards)


def dead_page_keys(snapshot: Snapshot | None, view: View) -> list[str]:
    """The keys whose dead letters the view's page shows (read for it, and only those)."""
    if snapshot is None:
        return []
    return [row.key for row in view.dead_keys(snapshot.dead_keys).rows]


def fragments(
    reading: Reading,
    letters: Mapping[str, list[DeadRow]],
    samples: Sequence[Sample],
    view: View,
    frame: Frame,
) -> dict[str, str]:
    """Every part of the page that a refresh replaces, by element id."""
    snapshot = reading.snapshot
    now = time.time()
    work = snapshot.work if snapshot else ()
    dead_keys = snapshot.dead_keys if snapshot else ()
    locks = snapshot.locks if snapshot else ()
    return {
        "status": _status(reading, frame),
        "totals": _totals(snapshot),
        "chart": chart(samples, now=now, window=frame.window),
        "keys": keys_table(snapshot, view.keys(work), view, now),
        "dead": dead_table(snapshot, view.dead_keys(dead_keys), letters, view, frame),
        "locks": locks_table(snapshot, view.locks(locks), view, frame),
    }


_SORT_LABELS = (
    ("age", "oldest first"),
    ("pending", "most pending first"),
    ("dead", "most dead letters first"),
    ("key", "by key"),
)


def page(parts: Mapping[str, str], view: View, frame: Frame) -> str:
    """The whole page, with ``parts`` (:func:`fragments`) in place."""
    root = escape(frame.root)
    asset = f"v={escape(frame.version)}"
    mode = (
        '<span class="mode actions">actions allowed</span>'
        if frame.actions
        else '<span class="mode">read-only</span>'
    )
    sorts = "".join(
        f'<option value="{value}"{" selected" if view.sort == value else ""}>{label}</option>'
        for value, label in _SORT_LABELS
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>asynclock dashboard</title>
<link rel="stylesheet" href="{root}/static/dashboard.css?{asset}">
<script src="{root}/static/dashboard.js?{asset}" defer></script>
</head>
<body data-root="{root}" data-refresh="{frame.refresh:g}" data-csrf="{escape(frame.csrf)}">
<header>
<h1>asynclock</h1>
<span class="state" title="the state this dashboard reads">{escape(frame.title)}</span>
{mode}
<span id="status" aria-live="polite">{parts["status"]}</span>
<button type="button" id="pause" aria-pressed="false">Pause</button>
</header>
<main>
<section id="totals" class="cards">{parts["totals"]}</section>
<section id="chart">{parts["chart"]}</section>
<form class="filter" method="get" role="search">
<label>Filter keys <input id="filter" name="q" type="search" value="{escape(view.q)}"
 placeholder="part of a key or owner" autocomplete="off"></label>
<label>Sort <select id="sort" name="sort">{sorts}</select></label>
<noscript><button type="submit">Apply</button></noscript>
</form>
<section id="keys">{parts["keys"]}</section>
<section id="dead">{parts["dead"]}</section>
<section id="locks">{parts["locks"]}</section>
</main>
<footer>Refreshed every {duration(frame.refresh)} while this tab is visible; the chart keeps
the last {duration(frame.window)} in the dashboard's memory. Payloads are shown only when asked
for{"" if frame.payloads else " (turned off here)"}.</footer>
<dialog id="confirm"><form method="dialog">
<p id="confirm-text"></p>
<menu><button value="cancel" type="submit">Cancel</button>
<button value="ok" type="submit" id="confirm-ok" class="danger">Confirm</button></menu>
</form></dialog>
<dialog id="payload"><form method="dialog">
<p id="payload-title"></p><pre id="payload-text"></pre>
<menu><button value="close" type="submit">Close</button></menu>
</form></dialog>
<div id="toast" role="status" aria-live="polite" hidden></div>
</body>
</html>
"""
