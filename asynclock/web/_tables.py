"""The three tables of the page as HTML fragments: keys with work, dead letters, locks held.

Every text from the state (keys, owners, errors) goes through :func:`html.escape`; the page's
script swaps these fragments in as they come, and reads what a button does from its ``data-*``
attributes.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, TypeVar

from asynclock._owner import owner_parts
from asynclock.web._chart import duration
from asynclock.web._views import LETTERS_PER_KEY

if TYPE_CHECKING:
    from collections.abc import Mapping

    from asynclock.web._snapshot import DeadRow, KeyRow, LockRow, Snapshot
    from asynclock.web._views import Page, View

__all__ = ("Frame", "dead_table", "escape", "keys_table", "locks_table", "moment")

T = TypeVar("T")

#: an oldest age past these many seconds is shown as a warning, then as critical
WARN_AGE, CRITICAL_AGE = 60.0, 600.0
#: characters of an error shown in its row (the whole of it one click away)
ERROR_PREVIEW = 160


@dataclass(frozen=True, slots=True)
class Frame:
    """What every fragment of one dashboard needs besides the data.

    ``actions`` names the actions this dashboard offers (``requeue``, ``discard``, ``unlock``:
    allowed, and the state can do them); ``payloads``: a dead letter's payload may be asked for.
    """

    root: str
    title: str
    refresh: float
    window: float
    csrf: str
    actions: frozenset[str]
    payloads: bool
    version: str


def escape(text: object) -> str:
    """``text`` for HTML text and (double-quoted) attribute values."""
    return html.escape(str(text), quote=True)


def moment(at: float) -> str:
    """A ``<time>`` of the UNIX time ``at``: UTC text, made local by the page's script."""
    when = datetime.fromtimestamp(at, tz=timezone.utc)
    iso = when.isoformat(timespec="seconds").replace("+00:00", "Z")
    return f'<time datetime="{iso}">{when:%H:%M:%S} UTC</time>'


def _pager(name: str, page: Page[T], view: View, table: str, nouns: tuple[str, str]) -> str:
    """``« previous · page 2 of 20 (1,000 keys) · next »``, as links (they work without JS)."""
    noun = nouns[0] if page.total == 1 else nouns[1]
    if page.pages <= 1:
        return f'<p class="pager">{page.total:,} {noun}</p>'
    parts = [f'<nav class="pager" aria-label="{escape(name)} pages">']
    parts.append(_page_link(view, table, page.number - 1, "« previous", page.number > 1))
    parts.append(f"<span>page {page.number} of {page.pages} ({page.total:,} {noun})</span>")
    parts.append(_page_link(view, table, page.number + 1, "next »", page.number < page.pages))
    parts.append("</nav>")
    return "".join(parts)


def _page_link(view: View, table: str, number: int, label: str, enabled: bool) -> str:
    if not enabled:
        return f'<span class="disabled">{label}</span>'
    query = view.paged(table, number).query()
    return f'<a href="?{escape(query)}" data-view="{table}" data-value="{number}">{label}</a>'


def _age_class(age: float) -> str:
    if age >= CRITICAL_AGE:
        return "critical"
    return "warn" if age >= WARN_AGE else ""


def _status(row: KeyRow) -> tuple[str, str]:
    """The key's state, most pressing first: (badge text, css class)."""
    if row.parked:
        return "parked", "critical"
    if row.retry_at is not None:
        return "retrying", "warn"
    if row.holder is not None:
        return "handling", "ok"
    return "waiting", _age_class(row.oldest_age) or "idle"


def _sort_header(view: View, sort: str, label: str) -> str:
    current = ' aria-sort="descending" class="sorted"' if view.sort == sort else ""
    query = replace(view, sort=sort, keys_page=1).query()
    return (
        f'<th{current}><a href="?{escape(query)}" data-view="sort" data-value="{sort}">'
        f"{label}</a></th>"
    )


def keys_table(snapshot: Snapshot | None, page: Page[KeyRow], view: View, now: float) -> str:
    """The keys with work: state, key, pending, oldest age, and what the state reports of
    holders, attempts, retries and parking."""
    title = "<h2>Keys with work</h2>"
    if snapshot is None:
        return title + '<p class="note">Not read yet.</p>'
    if not snapshot.inbox:
        return title + '<p class="note">This state has no durable inbox.</p>'
    fields = snapshot.fields
    head = [
        "<th>state</th>",
        _sort_header(view, "key", "key"),
        _sort_header(view, "pending", "pending"),
        _sort_header(view, "age", "oldest"),
    ]
    if "holder" in fields:
        head.append("<th>holder</th>")
    if "attempt" in fields:
        head.append("<th>attempt</th>")
    if "retry" in fields:
        head.append("<th>retrying until</th>")
    head.append(_sort_header(view, "dead", "dead letters"))
    rows = []
    for row in page.rows:
        badge, css = _status(row)
        age = duration(row.oldest_age) if row.pending else "-"
        cells = [
            f'<td><span class="badge {css}">{badge}</span></td>',
            f'<td class="key">{escape(row.key)}</td>',
            f'<td class="num">{row.pending:,}</td>',
            f'<td class="num {_age_class(row.oldest_age)}">{age}</td>',
        ]
        if "holder" in fields:
            cells.append(_holder(row.holder))
        if "attempt" in fields:
            cells.append(f'<td class="num">{"" if row.attempt is None else row.attempt}</td>')
        if "retry" in fields:
            cells.append(_retry(row.retry_at, now))
        cells.append(f'<td class="num">{row.dead or ""}</td>')
        rows.append(f'<tr data-key="{escape(row.key)}">{"".join(cells)}</tr>')
    if not rows:
        empty = "no key matches the filter" if view.q else "no pending events: the inbox is drained"
        rows.append(f'<tr><td class="empty" colspan="{len(head)}">{empty}</td></tr>')
    table = (
        f'<table class="keys"><thead><tr>{"".join(head)}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )
    return title + table + _pager("keys", page, view, "kp", ("key", "keys"))


def _holder(owner: str | None) -> str:
    if owner is None:
        return "<td></td>"
    host, pid = owner_parts(owner)
    return f'<td class="owner" title="{escape(owner)}">{escape(host)}:{escape(pid)}</td>'


def _retry(at: float | None, now: float) -> str:
    if at is None:
        return "<td></td>"
    left = at - now
    when = f"in {duration(left)}" if left > 0 else f"due {duration(-left)} ago"
    return f'<td>{moment(at)} <span class="muted">({when})</span></td>'


def dead_table(
    snapshot: Snapshot | None,
    page: Page[KeyRow],
    letters: Mapping[str, list[DeadRow]],
    view: View,
    frame: Frame,
) -> str:
    """The dead letters, grouped by key (the most first), with each key's actions."""
    title = "<h2>Dead letters</h2>"
    if snapshot is None or not snapshot.inbox:
        return title + '<p class="note">Nothing to show.</p>'
    offered = [a for a in ("requeue", "discard") if a in frame.actions]
    groups = []
    for row in page.rows:
        found = letters.get(row.key, [])
        buttons = "".join(_button(action, row.key, row.dead) for action in offered)
        groups.append(
            f'<tbody class="group" data-key="{escape(row.key)}"><tr class="group-head">'
            f'<th colspan="4" class="key">{escape(row.key)} <span class="muted">'
            f"{row.dead:,} dead letter{'s' if row.dead != 1 else ''}</span></th>"
            f'<th class="actions">{buttons}</th></tr>'
        )
        groups.extend(_letter(letter, frame) for letter in found[:LETTERS_PER_KEY])
        if len(found) > LETTERS_PER_KEY:
            more = len(found) - LETTERS_PER_KEY
            groups.append(
                f'<tr><td colspan="5" class="muted">and {more:,} more (the oldest are shown: a '
                "requeue puts them back first)</td></tr>"
            )
        groups.append("</tbody>")
    if not groups:
        empty = "no key matches the filter" if view.q else "no dead letters"
        groups.append(f'<tbody><tr><td class="empty" colspan="5">{empty}</td></tr></tbody>')
    head = "<thead><tr><th>entry</th><th>attempts</th><th>error</th><th>when</th><th></th></tr></thead>"
    note = ""
    if not frame.actions and snapshot.dead_keys:
        note = (
            '<p class="note">Read-only: requeue and discard are offered when the dashboard is '
            "started with <code>--allow-actions</code> (<code>allow_actions=True</code>).</p>"
        )
    pager = _pager("dead letters", page, view, "dp", ("key", "keys"))
    return f'{title}{note}<table class="dead">{head}{"".join(groups)}</table>{pager}'


def _letter(letter: DeadRow, frame: Frame) -> str:
    error = letter.error.strip() or "(no error text)"
    first = error.splitlines()[0]
    preview = first if len(first) <= ERROR_PREVIEW else first[:ERROR_PREVIEW] + "…"
    if preview != error:
        shown = (
            f'<details><summary>{escape(preview)}</summary><pre class="error">{escape(error)}'
            "</pre></details>"
        )
    else:
        shown = f'<span class="error">{escape(error)}</span>'
    when = moment(letter.at) if letter.at is not None else ""
    if letter.seen:
        when = f'<span title="the state does not record when; first seen by this dashboard">seen {when}</span>'
    payload = ""
    if frame.payloads:
        payload = (
            f'<button type="button" class="link" data-payload-key="{escape(letter.key)}" '
            f'data-payload-id="{letter.id}">payload ({letter.size:,} chars)</button>'
        )
    return (
        f'<tr class="letter"><td class="num">#{letter.id}</td><td class="num">{letter.attempts}</td>'
        f"<td>{shown}</td><td>{when}</td><td>{payload}</td></tr>"
    )


#: what each action's button says, and the question its confirmation asks
ACTION_TEXT = {
    "requeue": (
        "Requeue",
        (
            "Put the {n} dead letter(s) of {key} back at the head of its inbox? A worker "
            "delivers them again, from attempt 1."
        ),
    ),
    "discard": ("Discard", "Delete the {n} dead letter(s) of {key} for good?"),
    "unlock": (
        "Force unlock",
        (
            "Release {key}, held by {owner} (token {token})? The holder is not told: its next "
            "extend or release fails, and a live holder keeps working without the lock."
        ),
    ),
}


def _button(action: str, key: str, count: int, *, owner: str = "", token: str = "") -> str:
    """An action's button; the page's script asks ``data-confirm`` before it posts."""
    label, question = ACTION_TEXT[action]
    confirm = question.format(n=f"{count:,}", key=repr(key), owner=owner, token=token)
    extra = f' data-token="{escape(token)}"' if token else ""
    return (
        f'<button type="button" class="action {action}" data-action="{action}" '
        f'data-key="{escape(key)}" data-confirm="{escape(confirm)}"{extra}>{label}</button>'
    )


def locks_table(snapshot: Snapshot | None, page: Page[LockRow], view: View, frame: Frame) -> str:
    """The locks held: key, holder's host and pid, seconds left, token, owner id."""
    title = "<h2>Locks held</h2>"
    if snapshot is None:
        return title + '<p class="note">Not read yet.</p>'
    if not snapshot.locks_listed:
        return title + '<p class="note">This state cannot list its locks.</p>'
    unlock = "unlock" in frame.actions
    rows = []
    for lock in page.rows:
        button = ""
        if unlock:
            button = _button("unlock", lock.key, 1, owner=lock.owner, token=str(lock.token))
        rows.append(
            f'<tr data-key="{escape(lock.key)}"><td class="key">{escape(lock.key)}</td>'
            f"<td>{escape(lock.host)}</td><td>{escape(lock.pid)}</td>"
            f'<td class="num">{lock.remaining:.1f}</td><td class="num">{lock.token}</td>'
            f'<td class="owner">{escape(lock.owner)}</td><td class="actions">{button}</td></tr>'
        )
    if not rows:
        empty = "no lock matches the filter" if view.q else "no locks held"
        rows.append(f'<tr><td class="empty" colspan="7">{empty}</td></tr>')
    head = (
        "<thead><tr><th>key</th><th>host</th><th>pid</th><th>seconds left</th><th>token</th>"
        "<th>owner</th><th></th></tr></thead>"
    )
    pager = _pager("locks", page, view, "lp", ("lock", "locks"))
    return f'{title}<table class="locks">{head}<tbody>{"".join(rows)}</tbody></table>{pager}'
