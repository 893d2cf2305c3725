"""The webhook storm, without and with asynclock (``asynclock demo``).

A burst of "first message" webhooks arrives for a handful of contacts at once. Each handler
runs the find-or-create path of a chat app: look for the contact's active conversation, wait
for the (simulated) database round trip, create a conversation if there was none, then append
the message. Without a lock, every handler for one contact sees "no conversation yet" and
creates its own; with one :class:`~asynclock.AsyncLock` per contact around find-or-create,
exactly one conversation per contact is created and every message lands in it.

This is the race from the origin story (Instagram webhooks in a Rails chat app); run it with
``python -m asynclock demo`` (``--state redis://...`` to use Redis).

A second section runs the same storm the way the origin story's job does it, with a
non-blocking lock (see :mod:`asynclock.cli._storm`): without a lock (duplicates), with a lock but no
retry (a conflict loses the message), and with ``retry_on_lock_conflict(wait=lambda n: step * n,
attempts=3, on_exhaustion="process_without_lock")`` whose retry window equals the lock's TTL
(neither).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from asynclock._lock.lock import AsyncLock
from asynclock._validate import check_seconds
from asynclock.cli._demo_dispatch import DispatchTally, format_dispatch, run_dispatch_demo
from asynclock.cli._storm import (
    VARIANTS,
    MemoryConversations,
    Message,
    StormTally,
    run_storm,
    storm_handler,
    tally,
)
from asynclock.state import state_from_url
from asynclock.state._url import redact

if TYPE_CHECKING:
    from collections.abc import Sequence

    from asynclock.cli._storm import Variant
    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")

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
        storms: the retry section, one tally per variant of :mod:`asynclock.cli._storm`
            (``no lock``, ``lock, no retry``, ``lock + retry``); empty when it was not run.
        storm_ttl: the lock TTL of the retry section, in seconds (its retry window: the same).
    """

    state_url: str
    contacts: int
    gap: float
    scenarios: tuple[ScenarioResult, ...]
    storms: tuple[StormTally, ...] = ()
    storm_ttl: float = 0.0
    dispatch: tuple[DispatchTally, ...] = ()


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


def storm_ttl_for(gap: float) -> float:
    """The retry section's lock TTL: 0.3 s, or ten round trips when those are longer."""
    return max(0.3, round(10 * gap, 3))


async def _retry_storms(
    state: State, tasks: int, contacts: int, gap: float
) -> tuple[StormTally, ...]:
    messages = [Message(n, n % contacts) for n in range(tasks)]
    random.Random(0).shuffle(messages)
    ttl = storm_ttl_for(gap)
    step = ttl / 3  # waits step, then 2 * step: the last attempt starts one TTL after the first
    # The fallback's warnings are the point of the table below, not noise for stderr: keep
    # them from logging's last-resort handler (a configured root logger still gets them).
    quiet = logging.NullHandler()
    logger.addHandler(quiet)
    try:
        return tuple([await _retry_storm(state, v, messages, ttl, step, gap) for v in VARIANTS])
    finally:
        logger.removeHandler(quiet)


async def _retry_storm(
    state: State, variant: Variant, messages: list[Message], ttl: float, step: float, gap: float
) -> StormTally:
    db = MemoryConversations()
    handler = storm_handler(
        variant,
        state,
        db,
        ttl=ttl,
        gap=gap,
        wait=lambda executions: step * executions,
        attempts=3,
        lock_ttl=ttl,
    )
    _, wall_time = await run_storm(handler, messages)
    return await tally(db, messages, variant, wall_time, handler.statistics(), len(handler.overran))


async def run_demo(
    state_url: str = "memory://",
    tasks: int = 20,
    contacts: int = 5,
    gap: float = 0.02,
    *,
    retry: bool = True,
    dispatcher: bool = True,
) -> DemoResult:
    """Run the webhook storm twice: without a lock, then with one ``AsyncLock`` per contact;
    then (``retry=True``) the retry section: no lock, a non-blocking lock without retry, and
    the lock inside ``retry_on_lock_conflict(..., on_exhaustion="process_without_lock")``.

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
        retry: also run the retry section (lock TTL :func:`storm_ttl_for` ``(gap)``, 0.3 s by
            default, so it adds about that much time).
        dispatcher: also run the EventDispatcher section (a chat burst through each
            ``on_lock_conflict`` policy).

    Returns:
        Both runs' results, no-lock first, and the retry section's tallies.

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
        storms = await _retry_storms(state, tasks, contacts, seconds) if retry else ()
        dispatch = await run_dispatch_demo(state) if dispatcher else ()
    return DemoResult(
        state_url=state_url,
        contacts=contacts,
        gap=seconds,
        scenarios=(unlocked, locked),
        storms=storms,
        storm_ttl=storm_ttl_for(seconds) if retry else 0.0,
        dispatch=dispatch,
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


_STORM_COLUMNS = (
    "variant",
    "messages",
    "conversations",
    "duplicates",
    "stranded",
    "dropped",
    "processed twice",
    "wall time",
)

_STORM_LABELS = {
    "no lock": "no lock",
    "lock, no retry": "lock, no retry",
    "lock + retry": "lock + retry_on_lock_conflict",
}


def _storm_row(tallied: StormTally) -> Sequence[str]:
    return (
        _STORM_LABELS.get(tallied.variant, tallied.variant),
        str(tallied.messages),
        str(tallied.conversations),
        str(tallied.duplicates),
        str(tallied.stranded),
        str(tallied.lost),
        str(tallied.processed_twice),
        f"{tallied.wall_time * 1000:.0f} ms",
    )


def _table(columns: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    rows = [columns, *body]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]

    def line(row: Sequence[str]) -> str:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join(cells).rstrip()

    return [line(columns), "  ".join("-" * width for width in widths), *map(line, body)]


def _format_storms(result: DemoResult) -> list[str]:
    ttl = result.storm_ttl
    step = ttl / 3
    out = [
        "",
        "retry_on_lock_conflict: the same storm, each handler inside",
        f'  AsyncLock(state, "ig:contact:<id>", ttl={ttl:g}, blocking=False), the origin story\'s job;',
        f'  retry: wait=lambda n: {step:g} * n, attempts=3, on_exhaustion="process_without_lock"',
        (
            f"  (conflicts at ~0, {step * 1000:.0f} and {3 * step * 1000:.0f} ms: the fallback "
            "runs once the holder's TTL is over)"
        ),
        "",
        *_table(_STORM_COLUMNS, [_storm_row(t) for t in result.storms]),
        "",
        "lost messages, two kinds: stranded = in a duplicate conversation, out of the agent's",
        "sight; dropped = never stored (LockAcquisitionError and no retry: a dead-lettered job).",
    ]
    retried = result.storms[-1]
    if retried.retry is not None:
        stats = retried.retry
        out.append(
            f"retry counters: {stats.conflicts} conflicts, {stats.retries} retries, "
            f"{stats.processed_without_lock} processed without the lock."
        )
    clean = (retried.duplicates, retried.stranded, retried.lost, retried.processed_twice)
    if clean == (0, 0, 0, 0):
        dropped = next((t.lost for t in result.storms if t.variant == "lock, no retry"), 0)
        out.append(
            "With retry_on_lock_conflict: one conversation per contact, no message lost "
            f"(no retry: {dropped} dropped)."
        )
    else:  # pragma: no cover - would mean the retry window failed; say so loudly
        out.append("UNEXPECTED: the retried run still duplicated or lost messages.")
    return out


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
    if result.storms:
        out += _format_storms(result)
    if result.dispatch:
        out += format_dispatch(result.dispatch)
    return "\n".join(out) + "\n"
