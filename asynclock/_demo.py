"""The webhook storm, without and with asynclock (``asynclock demo``).

A burst of "first message" webhooks arrives for a handful of contacts at once. Each handler
runs the find-or-create path of a chat app: look for the contact's active conversation, wait
for the (simulated) database round trip, create a conversation if there was none, then append
the message. Without a lock, every handler for one contact sees "no conversation yet" and
creates its own; with one :class:`~asynclock.AsyncLock` per contact around find-or-create,
exactly one conversation per contact is created and every message lands in it.

This is the race from the origin story (Instagram webhooks in a Rails chat app); run it with
``python -m asynclock demo`` (``--state redis://...`` to use Redis).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asynclock import AsyncLock, state_from_url
from asynclock._validate import check_seconds
from asynclock.state._url import redact

if TYPE_CHECKING:
    from collections.abc import Sequence

    from asynclock.state._protocol import State

__all__ = ("DemoResult", "ScenarioResult", "format_result", "run_demo")


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """What one run of the storm did to the simulated database.

    Attributes:
        scenario: a short label, e.g. ``"no lock"``.
        messages: how many webhook handlers ran (one message each).
        conversations: how many conversations they created.
        duplicates: conversations beyond the first one per contact (the bug).
        lost_messages: messages that are not in the conversation an agent opening the contact
            would see (the contact's first conversation): stored in a duplicate, or not at all.
        wall_time: seconds from the first handler's start to the last one's end.
    """

    scenario: str
    messages: int
    conversations: int
    duplicates: int
    lost_messages: int
    wall_time: float


@dataclass(frozen=True, slots=True)
class DemoResult:
    """Both runs of :func:`run_demo`, in the order they ran.

    Attributes:
        state_url: the state URL the locked run used, as the caller gave it.
        contacts: how many distinct contacts the messages were spread over.
        gap: the simulated database round trip, in seconds.
        scenarios: ``(no lock, with AsyncLock)``.
    """

    state_url: str
    contacts: int
    gap: float
    scenarios: tuple[ScenarioResult, ...]


@dataclass(slots=True)
class _Conversation:
    id: int
    contact_id: int
    messages: list[int] = field(default_factory=list)


@dataclass(slots=True)
class _Database:
    """A stand-in for the app's SQL database: a dict of conversations, async by ``gap``."""

    gap: float
    conversations: dict[int, _Conversation] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def find_active_conversation(self, contact_id: int) -> _Conversation | None:
        # Read, then await the round trip: the answer may be stale by the time it arrives,
        # which is exactly the window two handlers for one contact race through.
        found = self._first_conversation(contact_id)
        await asyncio.sleep(self.gap)
        return found

    async def create_conversation(self, contact_id: int) -> _Conversation:
        conversation = _Conversation(id=next(self._ids), contact_id=contact_id)
        self.conversations[conversation.id] = conversation
        await asyncio.sleep(0)
        return conversation

    def _first_conversation(self, contact_id: int) -> _Conversation | None:
        # Ids increase, so the first match is the oldest conversation: the one the app shows.
        for conversation in self.conversations.values():
            if conversation.contact_id == contact_id:
                return conversation
        return None

    def score(self, scenario: str, messages: int, wall_time: float) -> ScenarioResult:
        per_contact: dict[int, int] = {}
        for conversation in self.conversations.values():
            per_contact[conversation.contact_id] = per_contact.get(conversation.contact_id, 0) + 1
        visible = 0
        for contact_id in per_contact:
            first = self._first_conversation(contact_id)
            assert first is not None
            visible += len(first.messages)
        return ScenarioResult(
            scenario=scenario,
            messages=messages,
            conversations=len(self.conversations),
            duplicates=sum(count - 1 for count in per_contact.values()),
            lost_messages=messages - visible,
            wall_time=wall_time,
        )


async def _first_message(db: _Database, message_id: int, contact_id: int) -> None:
    """The handler's find-or-create path, unprotected."""
    conversation = await db.find_active_conversation(contact_id)
    if conversation is None:
        conversation = await db.create_conversation(contact_id)
    conversation.messages.append(message_id)


async def _storm(
    scenario: str, tasks: int, contacts: int, gap: float, state: State | None
) -> ScenarioResult:
    db = _Database(gap=gap)

    async def handle(message_id: int) -> None:
        contact_id = message_id % contacts
        if state is None:
            await _first_message(db, message_id, contact_id)
            return
        async with AsyncLock(state, f"contact:{contact_id}", ttl=5.0):
            await _first_message(db, message_id, contact_id)

    started = time.perf_counter()
    # All handlers start in the same loop iteration: a burst, as when a platform redelivers.
    await asyncio.gather(*(handle(message_id) for message_id in range(tasks)))
    return db.score(scenario, tasks, time.perf_counter() - started)


async def run_demo(
    state_url: str = "memory://", tasks: int = 20, contacts: int = 5, gap: float = 0.02
) -> DemoResult:
    """Run the webhook storm twice: without a lock, then with one ``AsyncLock`` per contact.

    ``tasks`` concurrent handlers each process one "first message" for contact
    ``message_id % contacts``. Each does find-active-conversation, awaits ``gap`` seconds (the
    database round trip), then creates a conversation if it found none. The first run has no
    lock, so handlers for one contact create duplicate conversations; the second wraps
    find-or-create in ``async with AsyncLock(state, f"contact:{id}", ttl=5.0)``.

    Args:
        state_url: where the locks live, e.g. ``"memory://"`` or ``"redis://127.0.0.1:6379/0"``.
        tasks: number of concurrent handlers (messages), at least 1.
        contacts: number of distinct contacts the messages are spread over, at least 1.
        gap: the simulated database round trip in seconds, ``>= 0``.

    Returns:
        Both runs' results, no-lock first.

    Raises:
        ValueError: for a bad count, a negative gap or an unknown URL scheme.
        asynclock.StateUnavailableError: the state server cannot be reached.
    """
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise ValueError(f"tasks must be an int >= 1, got {tasks!r}")
    if isinstance(contacts, bool) or not isinstance(contacts, int) or contacts < 1:
        raise ValueError(f"contacts must be an int >= 1, got {contacts!r}")
    seconds = check_seconds(gap, "gap", allow_zero=True)
    assert seconds is not None
    unlocked = await _storm("no lock", tasks, contacts, seconds, None)
    async with state_from_url(state_url) as state:
        locked = await _storm("AsyncLock per contact", tasks, contacts, seconds, state)
    return DemoResult(
        state_url=state_url, contacts=contacts, gap=seconds, scenarios=(unlocked, locked)
    )


_COLUMNS = (
    "scenario",
    "messages",
    "conversations created",
    "duplicates",
    "lost messages",
    "wall time",
)


def _row(result: ScenarioResult) -> Sequence[str]:
    return (
        result.scenario,
        str(result.messages),
        str(result.conversations),
        str(result.duplicates),
        str(result.lost_messages),
        f"{result.wall_time * 1000:.0f} ms",
    )


def format_result(result: DemoResult) -> str:
    """Render a :class:`DemoResult` as a small aligned text table with a one-line verdict.

    Args:
        result: what :func:`run_demo` returned.

    Returns:
        The text to print, ending with a newline.
    """
    rows = [_COLUMNS, *(_row(s) for s in result.scenarios)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    messages = result.scenarios[0].messages
    header = (
        f"webhook storm: {messages} first messages for {result.contacts} contacts at once, "
        f"{result.gap * 1000:.0f} ms simulated DB round trip, locks on {redact(result.state_url)}"
    )
    out = [
        header,
        "",
        line(rows[0]),
        "  ".join("-" * width for width in widths),
        *(line(row) for row in rows[1:]),
        "",
        "duplicates: conversations beyond one per contact; lost messages: messages outside the",
        "conversation an agent sees for the contact (stranded in a duplicate).",
    ]
    unlocked, locked = result.scenarios
    if locked.duplicates == 0 and locked.lost_messages == 0:
        out.append(
            f"With AsyncLock: one conversation per contact, every message kept "
            f"(without: {unlocked.duplicates} duplicates)."
        )
    else:  # pragma: no cover - would mean the lock failed; say so loudly
        out.append("UNEXPECTED: the locked run still created duplicates.")
    return "\n".join(out) + "\n"
