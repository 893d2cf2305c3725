"""What the two example apps share: Slack payload -> Event, outcome -> HTTP answer, the handler.

Nothing here knows about a web framework: ``fastapi_bot.py`` and ``aiohttp_bot.py`` parse the
request body, call :func:`parse_payload`, dispatch (or submit) the event, and turn the outcome
into a response with :func:`answer_for`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asynclock
from asynclock import (
    Event,
    EventDispatcher,
    HandlerContext,
    InboxFullError,
    Outcome,
    StateError,
    StateUnavailableError,
)

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("examples.slack_bot")

#: where locks and dedupe records live; every worker process of the bot must share it
DEFAULT_STATE_URL = os.environ.get("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
#: the key prefix of this bot's records on a server (a server may host several bots)
DEFAULT_PREFIX = os.environ.get("ASYNCLOCK_PREFIX", "slack-bot:")
#: seconds of ``Retry-After`` when the busy lock is already gone by the time we look
FALLBACK_RETRY_AFTER = 1

#: outcomes after which the platform must not redeliver (the event was dealt with, or had been)
ACKNOWLEDGED = frozenset(
    {
        Outcome.HANDLED,
        Outcome.QUEUED,
        Outcome.SKIPPED,
        Outcome.FORCED,
        Outcome.DUPLICATE,
        Outcome.ACCEPTED,
    }
)


class BadPayload(ValueError):
    """The request body is not a Slack Events API payload we understand (answered 400)."""


@dataclass(frozen=True)
class Challenge:
    """Slack's ``url_verification`` handshake: answer with the challenge, dispatch nothing."""

    value: str


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, framework-neutral."""

    status: int
    body: Mapping[str, object]
    headers: Mapping[str, str] = field(default_factory=dict)


def state_options(state_url: str, prefix: str) -> dict[str, object]:
    """``state_from_url`` keywords: a server state gets ``prefix``; ``memory://`` takes none."""
    return {} if state_url.startswith("memory:") else {"prefix": prefix}


def _text(mapping: Mapping[str, object], name: str) -> str | None:
    value = mapping.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadPayload(f"{name} must be a string, got {type(value).__name__}")
    return value


def parse_payload(payload: object) -> Event | Challenge:
    """Turn a Slack Events API payload into an :class:`~asynclock.Event`.

    * ``thread_id`` is ``thread_ts`` (a reply in a thread), else ``ts`` (a top-level message
      starts its own thread), so every message of one conversation shares a lock key;
    * ``message_id`` is ``ts``, else the envelope's ``event_id``: a redelivery of the same
      message is a ``DUPLICATE``;
    * ``raw`` is the whole payload, untouched.

    Raises:
        BadPayload: not a JSON object, or no ``event`` with a ``type`` and a ``channel``.
    """
    if not isinstance(payload, Mapping):
        raise BadPayload("the body must be a JSON object")
    if payload.get("type") == "url_verification":
        challenge = _text(payload, "challenge")
        if challenge is None:
            raise BadPayload("url_verification without a challenge")
        return Challenge(challenge)
    inner = payload.get("event")
    if not isinstance(inner, Mapping):
        raise BadPayload("no 'event' object in the payload")
    event_type = _text(inner, "type")
    channel = _text(inner, "channel")
    if event_type is None or channel is None:
        raise BadPayload("the event needs a 'type' and a 'channel'")
    ts = _text(inner, "ts")
    event_id = _text(payload, "event_id")
    thread_id = _text(inner, "thread_ts") or ts or event_id
    if thread_id is None:
        raise BadPayload("the event needs a 'ts' (or the payload an 'event_id')")
    return Event(
        type=event_type,
        adapter="slack",
        channel_id=channel,
        thread_id=thread_id,
        message_id=ts or event_id,
        raw=payload,
    )


async def retry_after(bot: EventDispatcher, event: Event) -> int:
    """Seconds a platform should wait before redelivering ``event`` to its busy key.

    The holder's remaining lock TTL: the longest the key can stay busy should its holder die
    (a live holder renews, and usually finishes much sooner). At least one second.
    """
    try:
        info = await bot.state.inspect(bot.lock_key(event))
    except StateError:
        info = None
    if info is None:  # released between the conflict and this look: try again soon
        return FALLBACK_RETRY_AFTER
    return max(1, math.ceil(info.remaining))


async def answer_for(bot: EventDispatcher, event: Event, outcome: Outcome) -> Answer:
    """The HTTP answer to a delivery that ``bot.dispatch`` ended with ``outcome``.

    * 200 when the event was dealt with (also ``DUPLICATE``: acknowledged, nothing done);
    * 503 with ``Retry-After`` when it was ``DROPPED`` because its thread was busy: the
      platform redelivers it later, and the dispatcher forgot its dedupe record, so that
      redelivery is handled. Nothing is lost;
    * 500 when a handler failed (its dedupe record is forgotten too: a redelivery retries).
    """
    body: dict[str, object] = {"outcome": outcome.value, "message_id": event.message_id}
    if outcome in ACKNOWLEDGED:
        return Answer(200, body)
    if outcome is Outcome.DROPPED:
        seconds = await retry_after(bot, event)
        return Answer(503, {**body, "retry_after": seconds}, {"Retry-After": str(seconds)})
    return Answer(500, body)


async def accept_answer(bot: EventDispatcher, event: Event) -> Answer:
    """The HTTP answer to a delivery stored with ``bot.accept`` (the durable path).

    * 200 once the event is stored (``ACCEPTED``; a worker's ``serve()`` handles it, whatever
      crashes meanwhile) or was seen before (``DUPLICATE``);
    * 503 with ``Retry-After`` when its key's inbox is full (``InboxFullError``) or the state
      cannot be reached: nothing was stored, so the platform must redeliver.
    """
    body: dict[str, object] = {"message_id": event.message_id}
    try:
        outcome = await bot.accept(event)
    except InboxFullError as full:
        seconds = max(1, math.ceil(full.retry_after))
        return Answer(503, {**body, "error": "inbox full"}, {"Retry-After": str(seconds)})
    except StateUnavailableError:
        return Answer(503, {**body, "error": "state unavailable"}, {"Retry-After": "1"})
    return Answer(200, {**body, "outcome": outcome.value})


def worker_dispatcher(state_url: str, prefix: str, delay: float = 0.5) -> EventDispatcher:
    """The dispatcher a separate ``asynclock worker`` process serves, with the apps' handler."""
    state = asynclock.state_from_url(state_url, **state_options(state_url, prefix))
    work = Journal(delay)
    bot = EventDispatcher(state, on_lock_conflict="queue", raise_errors=False)

    @bot.on("*")
    async def reply(event: Event, ctx: HandlerContext) -> None:
        await work.work(event, ctx)

    return bot


@dataclass(frozen=True)
class Handled:
    """One event a handler finished."""

    message_id: str | None
    lock_key: str
    token: int | None
    skipped: tuple[str | None, ...]
    text: str


class Journal:
    """The example bot's work, and a record of it (what the tests and ``GET /stats`` look at).

    Attributes:
        delay: seconds each handler pretends to work.
        gate: when set by a test, handlers wait for it before finishing (``None``: never wait).
        fail_once: message ids whose next handling raises (a simulated handler error).
        deliveries: requests that reached an event endpoint.
        handled: the events handlers finished, in order.
        running: handlers running right now, per lock key.
        most_per_key: the most handlers ever seen running at once for one key (must stay 1).
        most_at_once: the most handlers ever seen running at once, all keys together.
        closing: set when the app's shutdown begins (before the dispatcher drains).
    """

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.gate: asyncio.Event | None = None
        self.fail_once: set[str] = set()
        self.deliveries = 0
        self.handled: list[Handled] = []
        self.running: dict[str, int] = {}
        self.most_per_key = 0
        self.most_at_once = 0
        self.closing = asyncio.Event()
        self._changed = asyncio.Event()

    @property
    def running_total(self) -> int:
        return sum(self.running.values())

    def _touch(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def delivered(self) -> None:
        """Count a request to an event endpoint."""
        self.deliveries += 1
        self._touch()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds (checked after every change; bound it with a timeout)."""
        while not condition():
            await self._changed.wait()

    async def work(self, event: Event, ctx: HandlerContext) -> None:
        """Pretend to answer ``event`` (``delay`` seconds, then the test's ``gate``); record it."""
        key = ctx.lock_key
        self.running[key] = self.running.get(key, 0) + 1
        self.most_per_key = max(self.most_per_key, self.running[key])
        self.most_at_once = max(self.most_at_once, self.running_total)
        self._touch()
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.gate is not None:
                await self.gate.wait()
            if event.message_id is not None and event.message_id in self.fail_once:
                self.fail_once.discard(event.message_id)
                raise RuntimeError(f"simulated failure handling {event.message_id}")
            inner = event.raw.get("event")
            text = inner.get("text") if isinstance(inner, Mapping) else None
            self.handled.append(
                Handled(
                    event.message_id,
                    key,
                    ctx.token,
                    tuple(e.message_id for e in ctx.skipped),
                    text if isinstance(text, str) else "",
                )
            )
        finally:
            self.running[key] -= 1
            if not self.running[key]:
                del self.running[key]
            self._touch()

    def snapshot(self, bot: EventDispatcher | None) -> dict[str, object]:
        """What ``GET /stats`` shows."""
        return {
            "deliveries": self.deliveries,
            "handled": [h.message_id for h in self.handled],
            "running": dict(self.running),
            "most_per_key": self.most_per_key,
            "outcomes": {} if bot is None else {o.value: n for o, n in bot.stats.items()},
        }
