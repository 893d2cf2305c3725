"""The webhook storm of issue #3, shared by ``asynclock demo`` and the test suite.

Instagram-style "first message" webhooks for one contact arrive at once. Each handler runs the
find-or-create path of a chat app: find the contact's active conversation, a database round
trip later create one if there was none, then append the message. Three ways to run it:

* ``"no lock"``: handlers of one contact all see "no conversation yet": duplicates.
* ``"lock, no retry"``: ``AsyncLock(..., blocking=False)`` around find-or-create; a handler
  that meets a held lock raises ``LockAcquisitionError`` and its message is lost (the Rails
  job that ran out of retries and was dead-lettered).
* ``"lock + retry"``: the same lock, in a coroutine decorated with
  ``retry_on_lock_conflict(wait=lambda n: step * n, attempts=3,
  on_exhaustion="process_without_lock")`` whose retry window lines up with the lock's TTL:
  no duplicates, nothing lost.

The "database" is anything with the four coroutines of :class:`Conversations`: the demo uses
:class:`MemoryConversations`; the cross-process tests use Redis itself. Only what the demo
runs lives here: the tests' own pieces (shuffled messages, the workers, the Redis database)
live with them, under ``tests/``.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from asynclock._errors import LockAcquisitionError, LockNotOwnedError
from asynclock._lock.lock import AsyncLock
from asynclock._retry.decorator import RetryStatistics, retry_on_lock_conflict

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    from asynclock._retry.decorator import WaitSpec
    from asynclock.state._protocol import State

__all__ = (
    "VARIANTS",
    "Conversations",
    "MemoryConversations",
    "Message",
    "StormHandler",
    "StormTally",
    "Variant",
    "find_or_create",
    "lock_key",
    "run_storm",
    "storm_handler",
    "tally",
)

Variant = Literal["no lock", "lock, no retry", "lock + retry"]
VARIANTS: tuple[Variant, ...] = ("no lock", "lock, no retry", "lock + retry")


@dataclass(frozen=True, slots=True)
class Message:
    """One webhook delivery: message ``id`` (unique) from contact ``contact``."""

    id: int
    contact: int


def lock_key(contact: int) -> str:
    """The lock of one contact's first-message path, as in the origin story."""
    return f"ig:contact:{contact}"


class Conversations(Protocol):
    """The app's database, reduced to what find-or-create needs (and what the tally reads)."""

    async def find_active(self, contact: int) -> int | None:
        """The contact's active conversation (its first one), or ``None``."""
        ...

    async def create(self, contact: int) -> int:
        """Create a conversation for the contact; return its id."""
        ...

    async def append(self, conversation: int, message: int) -> None:
        """Append a message to a conversation."""
        ...

    async def snapshot(self) -> dict[int, dict[int, list[int]]]:
        """``{contact: {conversation: [message ids]}}`` of everything stored."""
        ...


@dataclass(slots=True)
class MemoryConversations:
    """An in-process :class:`Conversations`: dicts, one event-loop step per operation."""

    _by_contact: dict[int, list[int]] = field(default_factory=dict)
    _messages: dict[int, list[int]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    async def find_active(self, contact: int) -> int | None:
        found = self._by_contact.get(contact)
        await asyncio.sleep(0)
        return found[0] if found else None

    async def create(self, contact: int) -> int:
        conversation = next(self._ids)
        self._by_contact.setdefault(contact, []).append(conversation)
        self._messages[conversation] = []
        await asyncio.sleep(0)
        return conversation

    async def append(self, conversation: int, message: int) -> None:
        self._messages[conversation].append(message)
        await asyncio.sleep(0)

    async def snapshot(self) -> dict[int, dict[int, list[int]]]:
        await asyncio.sleep(0)
        return {
            contact: {c: list(self._messages[c]) for c in conversations}
            for contact, conversations in self._by_contact.items()
        }


async def find_or_create(db: Conversations, message: Message, gap: float) -> int:
    """The racy path: find, a round trip of ``gap`` seconds, create if none; then append.

    Returns the conversation the message went to.
    """
    conversation = await db.find_active(message.contact)
    await asyncio.sleep(gap)  # the answer may be stale by now: the race the lock dampens
    if conversation is None:
        conversation = await db.create(message.contact)
    await db.append(conversation, message.id)
    return conversation


@dataclass(frozen=True, slots=True)
class StormTally:
    """What one run of the storm left in the database.

    Attributes:
        variant: which way the handlers ran (see :data:`VARIANTS`), or a label.
        messages: messages delivered.
        conversations: conversations created.
        duplicates: conversations beyond the first one per contact.
        lost: messages in no conversation at all (dropped on a lock conflict).
        processed_twice: messages appended more than once.
        stranded: messages outside their contact's first conversation (the one an agent sees).
        wall_time: seconds from the first delivery to the last handler's end.
        retry: the decorator's counters, for ``"lock + retry"``.
        overran: handlers whose lock had expired before they left it (processed, but the
            TTL was too short for them: the lock no longer guaranteed anything).
    """

    variant: str
    messages: int
    conversations: int
    duplicates: int
    lost: int
    processed_twice: int
    stranded: int
    wall_time: float = 0.0
    retry: RetryStatistics | None = None
    overran: int = 0


async def tally(
    db: Conversations,
    messages: Sequence[Message],
    variant: str,
    wall_time: float = 0.0,
    retry: RetryStatistics | None = None,
    overran: int = 0,
) -> StormTally:
    """Count duplicates, lost, processed-twice and stranded messages in ``db``."""
    stored = await db.snapshot()
    seen: Counter[int] = Counter()
    stranded = 0
    conversations = 0
    for by_conversation in stored.values():
        conversations += len(by_conversation)
        for position, ids in enumerate(by_conversation.values()):
            seen.update(ids)
            if position > 0:
                stranded += len(ids)
    expected = {message.id for message in messages}
    return StormTally(
        variant=variant,
        messages=len(messages),
        conversations=conversations,
        duplicates=sum(max(len(c) - 1, 0) for c in stored.values()),
        lost=len(expected - set(seen)),
        processed_twice=sum(1 for count in seen.values() if count > 1),
        stranded=stranded,
        wall_time=wall_time,
        retry=retry,
        overran=overran,
    )


@dataclass(frozen=True, slots=True)
class StormHandler:
    """A handler of one variant: ``await handle(message)`` is ``True`` once it is processed,
    ``False`` when it was lost; ``statistics()`` is the decorator's counters, if any;
    ``overran`` the ids of messages whose handler outlived its lock's TTL."""

    handle: Callable[[Message], Awaitable[bool]]
    statistics: Callable[[], RetryStatistics | None]
    overran: list[int] = field(default_factory=list)


def storm_handler(
    variant: Variant,
    state: State,
    db: Conversations,
    *,
    ttl: float,
    gap: float,
    wait: WaitSpec = 1.0,
    attempts: int = 3,
    jitter: float = 0.15,
    lock_ttl: float | None = None,
) -> StormHandler:
    """The message handler of one variant.

    ``ttl`` is the lock's TTL; ``wait``, ``attempts``, ``jitter`` and ``lock_ttl`` go to
    :func:`retry_on_lock_conflict` (``"lock + retry"`` only), with
    ``on_exhaustion="process_without_lock"``.
    """
    overran: list[int] = []
    if variant == "no lock":

        async def unlocked(message: Message) -> bool:
            await find_or_create(db, message, gap)
            return True

        return StormHandler(unlocked, lambda: None, overran)

    async def locked(message: Message) -> bool:
        try:
            async with AsyncLock(state, lock_key(message.contact), ttl=ttl, blocking=False):
                await find_or_create(db, message, gap)
        except LockNotOwnedError:
            overran.append(message.id)  # processed, but after its lock had expired
        return True

    if variant == "lock, no retry":

        async def dead_lettered(message: Message) -> bool:
            try:
                return await locked(message)
            except LockAcquisitionError:
                return False  # the job gives up: the customer's message is gone

        return StormHandler(dead_lettered, lambda: None, overran)
    if variant == "lock + retry":
        retried = retry_on_lock_conflict(
            wait=wait,
            attempts=attempts,
            jitter=jitter,
            on_exhaustion="process_without_lock",
            lock_ttl=lock_ttl,
        )(locked)
        statistics: Callable[[], RetryStatistics] = retried.statistics  # type: ignore[attr-defined]
        return StormHandler(retried, statistics, overran)
    raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")


async def run_storm(handler: StormHandler, messages: Sequence[Message]) -> tuple[int, float]:
    """Deliver every message at once (one task each); return ``(processed, wall seconds)``."""
    started = time.perf_counter()
    results = await asyncio.gather(*(handler.handle(message) for message in messages))
    return sum(results), time.perf_counter() - started
