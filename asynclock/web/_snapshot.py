"""What the dashboard reads from a state, as plain rows: keys with work, dead letters, locks.

One *snapshot* is one ``InboxState.inbox_keys()`` and one walk of ``LockAdmin.held_locks()``,
nothing else; a key's dead letters are read apart (``inbox_dead_letters``), only for the keys
a page shows. The optional facts of a key (its holder and that holder's attempt, a retry's due
time, a parked flag) and of a dead letter (when it died) are read with ``getattr``: a state that
reports them gets their columns, one that does not gets a page without them. The holder of a
key is also the owner of its lock: a state that lists its locks always has that column.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from asynclock._owner import owner_parts
from asynclock.state import LockAdmin
from asynclock.state._protocol import InboxState

if TYPE_CHECKING:
    from asynclock.state import State

__all__ = (
    "OPTIONAL_FIELDS",
    "DeadRow",
    "KeyRow",
    "LockRow",
    "Snapshot",
    "dead_rows",
    "read_snapshot",
)

#: the optional facts of a key, each with the attribute names of ``InboxKey`` that carry it
#: (the first one present wins)
OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    "holder": ("holder", "owner"),
    "attempt": ("attempt", "attempts", "holder_attempt"),
    "retry": ("retry_in", "retry_at", "retrying_until", "retry_due", "due_in", "due_at", "due"),
    "parked": ("parked",),
}
#: when a dead letter died, if the state records it
_DEAD_AT = ("dead_at", "failed_at", "when", "at")
#: a time this large is a UNIX time in seconds; smaller ones are seconds from now (no retry is
#: due three years ahead, and no clock reads less than 1e8 since 1973); past 1e11 (the year
#: 5138 in seconds) it is a UNIX time in milliseconds, as Redis's TIME and PX speak
_EPOCH = 1e8
_EPOCH_MS = 1e11


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One key of the inbox: its pending entries and dead letters, and what it is doing."""

    key: str
    pending: int
    #: seconds since the oldest pending entry was accepted (the key's lag)
    oldest_age: float
    dead: int
    #: the owner id of the worker handling it, when the state says
    holder: str | None = None
    #: the delivery that worker is on (1 for the first), when the state says
    attempt: int | None = None
    #: the UNIX time its failed head is delivered again, when it waits for a retry
    retry_at: float | None = None
    #: stopped at a dead entry (``on_poison="park"``) until requeued or discarded
    parked: bool = False

    @property
    def has_work(self) -> bool:
        """Something is pending, waiting for a retry, or parked."""
        return self.pending > 0 or self.retry_at is not None or self.parked


@dataclass(frozen=True, slots=True)
class LockRow:
    """A lock held now."""

    key: str
    owner: str
    #: seconds left on its TTL when read
    remaining: float
    token: int

    @property
    def host(self) -> str:
        """The holder's host (from its owner id)."""
        return owner_parts(self.owner)[0]

    @property
    def pid(self) -> str:
        """The holder's process id (from its owner id; ``"?"`` for a custom owner)."""
        return owner_parts(self.owner)[1]


@dataclass(frozen=True, slots=True)
class DeadRow:
    """A dead letter, without its payload (read apart, only when asked for)."""

    key: str
    id: int
    attempts: int
    error: str
    #: the UNIX time it died, when the state records it (else when this dashboard first saw it)
    at: float | None
    #: ``True``: :attr:`at` is when the dashboard first saw it, not when it died
    seen: bool
    #: the payload's length in characters
    size: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One read of the state: every key with work or dead letters, every lock held.

    ``inbox`` / ``locks_listed`` say whether the state has those capabilities at all;
    ``fields`` names the optional facts (``OPTIONAL_FIELDS``) it reports; ``at`` is the UNIX time
    of the read and ``took`` how long it took, in seconds.
    """

    at: float
    took: float
    keys: tuple[KeyRow, ...]
    locks: tuple[LockRow, ...]
    inbox: bool
    locks_listed: bool
    fields: frozenset[str]

    @property
    def work(self) -> tuple[KeyRow, ...]:
        """The keys with work."""
        return tuple(row for row in self.keys if row.has_work)

    @property
    def dead_keys(self) -> tuple[KeyRow, ...]:
        """The keys with dead letters."""
        return tuple(row for row in self.keys if row.dead > 0)


def _first(value: object, names: tuple[str, ...]) -> tuple[bool, object]:
    """``(True, value)`` of the first attribute of ``names`` that ``value`` has."""
    for name in names:
        if hasattr(value, name):
            return True, getattr(value, name)
    return False, None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _unix_time(value: object, now: float, *, ago: bool = False) -> float | None:
    """A time as a UNIX time in seconds: ``value`` is one already (in seconds or milliseconds),
    or seconds from ``now`` (before it with ``ago``); ``None`` when it is not a number."""
    seconds = _number(value)
    if seconds is None:
        return None
    if seconds >= _EPOCH_MS:
        return seconds / 1000.0
    if seconds >= _EPOCH:
        return seconds
    return now - seconds if ago else now + seconds


def key_row(found: object, now: float) -> tuple[KeyRow, frozenset[str]]:
    """The row of one ``InboxKey`` (read with ``getattr``) and the optional facts it reports."""
    fields: set[str] = set()
    facts: dict[str, object] = {}
    for field, names in OPTIONAL_FIELDS.items():
        present, value = _first(found, names)
        if present:
            fields.add(field)
            facts[field] = value
    holder = facts.get("holder")
    attempt = facts.get("attempt")
    row = KeyRow(
        key=str(getattr(found, "key", "")),
        pending=int(getattr(found, "pending", 0) or 0),
        oldest_age=float(getattr(found, "oldest_age", 0.0) or 0.0),
        dead=int(getattr(found, "dead", 0) or 0),
        holder=holder if isinstance(holder, str) and holder else None,
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        retry_at=_unix_time(facts.get("retry"), now),
        parked=bool(facts.get("parked", False)),
    )
    return row, frozenset(fields)


async def read_snapshot(state: State) -> Snapshot:
    """One snapshot of ``state`` (see the module): ``inbox_keys()`` and ``held_locks()``."""
    started = time.monotonic()
    now = time.time()
    rows: list[KeyRow] = []
    fields: set[str] = set()
    inbox = isinstance(state, InboxState)
    if isinstance(state, InboxState):
        for found in await state.inbox_keys():
            row, reported = key_row(found, now)
            rows.append(row)
            fields |= reported
    listed = isinstance(state, LockAdmin)
    locks: list[LockRow] = []
    if isinstance(state, LockAdmin):
        locks = [
            LockRow(info.key, info.owner, info.remaining, info.token)
            async for info in state.held_locks()
        ]
        # a key is drained by the holder of its lock (the same key): a state that does not say
        # who handles a key still shows it, from the locks it lists anyway
        owners = {lock.key: lock.owner for lock in locks}
        rows = [r if r.holder else replace(r, holder=owners.get(r.key)) for r in rows]
        fields.add("holder")
    return Snapshot(
        at=now,
        took=time.monotonic() - started,
        keys=tuple(rows),
        locks=tuple(locks),
        inbox=inbox,
        locks_listed=listed,
        fields=frozenset(fields),
    )


async def dead_rows(state: State, key: str, seen: dict[tuple[str, int], float]) -> list[DeadRow]:
    """``key``'s dead letters, oldest first, without their payloads.

    ``seen`` maps ``(key, id)`` to when the dashboard first saw a dead letter: the time shown
    for a state that does not record when its letters died (updated here).
    """
    if not isinstance(state, InboxState):
        return []
    now = time.time()
    rows = []
    for letter in await state.inbox_dead_letters(key):
        present, value = _first(letter, _DEAD_AT)
        at = _unix_time(value, now, ago=True) if present else None
        first_seen = seen.setdefault((key, letter.id), now)
        rows.append(
            DeadRow(
                key=key,
                id=letter.id,
                attempts=letter.attempts,
                error=letter.error,
                at=at if at is not None else first_seen,
                seen=at is None,
                size=len(letter.payload),
            )
        )
    return rows
