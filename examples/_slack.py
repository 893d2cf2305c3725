"""What the two example apps share: settings, Slack payload -> Event, outcome -> HTTP answer.

Nothing here knows about a web framework: ``fastapi_bot.py`` and ``aiohttp_bot.py`` read their
:class:`Settings` from the environment, parse the request body with :func:`parse_payload`,
deliver, accept or submit the event, and turn what happened into a response with
:func:`delivery_answer` or :func:`accept_answer`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast, get_args

import asynclock
from asynclock import (
    Delivery,
    Event,
    EventDispatcher,
    HandlerContext,
    InboxFullError,
    PolicyName,
    StateUnavailableError,
)
from asynclock.state._protocol import InboxState

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("examples.slack_bot")

#: where locks and dedupe records live; every worker process of the bot must share it
DEFAULT_STATE_URL = os.environ.get("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
#: the key prefix of this bot's records on a server (a server may host several bots)
DEFAULT_PREFIX = os.environ.get("ASYNCLOCK_PREFIX", "slack-bot:")
#: what ``POST /slack/events`` does: ``durable`` (accept + serve), ``sync`` or ``background``
ROUTES = ("durable", "sync", "background")
#: this process, as ``GET /stats`` names it (a deployment's workers answer it in turn)
WORKER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Settings:
    """How an example app runs; :meth:`from_env` reads it from ``ASYNCLOCK_*`` variables.

    Attributes:
        state_url: where locks, dedupe records and the inbox live; every worker shares it.
        prefix: the key prefix of this bot's records on a server (a server may host several).
        route: what ``POST /slack/events`` does (see :data:`ROUTES`); the other routes stay.
        on_lock_conflict: what a busy thread's event does (``queue``: waits its turn).
        lock_ttl: seconds of each per-thread lock between renewals.
        delay: seconds the example handler pretends to work.
        journal_file: a file the example handler appends each handled message id to.
    """

    state_url: str = DEFAULT_STATE_URL
    prefix: str = DEFAULT_PREFIX
    route: str = "durable"
    on_lock_conflict: PolicyName = "queue"
    lock_ttl: float = 30.0
    delay: float = 0.5
    journal_file: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """``ASYNCLOCK_STATE_URL``, ``ASYNCLOCK_PREFIX``, ``ASYNCLOCK_ROUTE``,
        ``ASYNCLOCK_ON_LOCK_CONFLICT``, ``ASYNCLOCK_LOCK_TTL``, ``ASYNCLOCK_EXAMPLE_DELAY`` and
        ``ASYNCLOCK_EXAMPLE_JOURNAL``, each defaulting to the field's default.

        Raises:
            ValueError: a value is not one this app can run with (the message names it).
        """
        route = environ.get("ASYNCLOCK_ROUTE", "durable")
        if route not in ROUTES:
            raise ValueError(f"ASYNCLOCK_ROUTE must be one of {', '.join(ROUTES)}, got {route!r}")
        policy = environ.get("ASYNCLOCK_ON_LOCK_CONFLICT", "queue")
        if policy not in get_args(PolicyName):
            raise ValueError(
                f"ASYNCLOCK_ON_LOCK_CONFLICT must be one of {', '.join(get_args(PolicyName))}, "
                f"got {policy!r}"
            )
        return cls(
            state_url=environ.get("ASYNCLOCK_STATE_URL", DEFAULT_STATE_URL),
            prefix=environ.get("ASYNCLOCK_PREFIX", DEFAULT_PREFIX),
            route=route,
            on_lock_conflict=cast("PolicyName", policy),
            lock_ttl=_seconds(environ, "ASYNCLOCK_LOCK_TTL", 30.0),
            delay=_seconds(environ, "ASYNCLOCK_EXAMPLE_DELAY", 0.5),
            journal_file=environ.get("ASYNCLOCK_EXAMPLE_JOURNAL") or None,
        )


def _seconds(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {text!r}")
    return value


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


def is_redelivery(headers: Mapping[str, str]) -> bool:
    """Whether a request is Slack's redelivery of an event (``X-Slack-Retry-Num``).

    Slack redelivers when it did not get a 2xx within 3 seconds: the first delivery may still be
    in progress here or elsewhere, in a process that died. Such a delivery is answered after its
    outcome (``deliver``), never with an unconditional 2xx.
    """
    return any(name.lower() == "x-slack-retry-num" for name in headers)


def _header_seconds(seconds: float) -> int:
    """``Retry-After`` is whole seconds: rounded up, so the retry never comes early; at least 1."""
    return max(1, math.ceil(seconds))


def delivery_answer(event: Event, delivery: Delivery) -> Answer:
    """The HTTP answer to a delivery that ``bot.deliver`` ended with ``delivery``.

    * 200 when the event was dealt with, or is a duplicate of one that was (done);
    * 503 with ``Retry-After`` when it was ``DROPPED`` (its thread was busy: the estimate of
      when it frees) or is a duplicate of a delivery still *in progress* (the lease's remaining
      time: if that worker died, the claim lapses by then and the redelivery is handled);
    * 500 when a handler failed (its dedupe record is forgotten: a redelivery retries).

    A 2xx is only ever given for an event that is handled (or will be, by the handler that runs
    it now); every other answer makes the platform redeliver it.
    """
    body: dict[str, object] = {"outcome": delivery.outcome.value, "message_id": event.message_id}
    if not delivery.redeliver:
        return Answer(200, body)
    if delivery.retry_after is None:
        return Answer(500, body)
    seconds = _header_seconds(delivery.retry_after)
    body = {**body, "in_progress": delivery.in_progress, "retry_after": seconds}
    return Answer(503, body, {"Retry-After": str(seconds)})


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
        seconds = _header_seconds(full.retry_after)
        return Answer(503, {**body, "error": "inbox full"}, {"Retry-After": str(seconds)})
    except StateUnavailableError:
        return Answer(503, {**body, "error": "state unavailable"}, {"Retry-After": "1"})
    return Answer(200, {**body, "outcome": outcome.value})


def submit_answer(bot: EventDispatcher, event: Event) -> Answer:
    """The HTTP answer to a delivery handed to ``bot.submit`` (answered before it is handled).

    * 202 once submitted: the dispatch runs in this process, and shutdown waits for it;
    * 503 with ``Retry-After`` when the app is shutting down (nothing was submitted);
    * 500 when the dispatcher refuses to submit under ``drop`` (a busy thread's event would be
      lost after the 202): a configuration error, answered so the platform redelivers.
    """
    try:
        bot.submit(event)
    except ValueError as refused:
        log.error("background route: %s", refused)
        return Answer(500, {"error": str(refused)})
    except RuntimeError:  # shutting down: the platform will redeliver
        return Answer(503, {"error": "shutting down"}, {"Retry-After": "1"})
    return Answer(202, {"accepted": event.message_id})


async def inbox_summary(bot: EventDispatcher) -> dict[str, object] | None:
    """The deployment's inbox, from the state: what is pending, how late, and dead letters.

    ``None`` when the state has no inbox, or cannot be reached now.
    """
    state = bot.state
    if not isinstance(state, InboxState):
        return None
    try:
        keys = await state.inbox_keys()
    except (StateUnavailableError, NotImplementedError):
        return None
    return {
        "pending": sum(k.pending for k in keys),
        "lag_seconds": max((k.oldest_age for k in keys), default=0.0),
        "dead_letters": sum(k.dead for k in keys),
        "keys": len(keys),
    }


def worker_dispatcher(settings: Settings) -> EventDispatcher:
    """The dispatcher a separate ``asynclock worker`` process serves, with the apps' handler."""
    url = settings.state_url
    state = asynclock.state_from_url(url, **state_options(url, settings.prefix))
    work = Journal(settings.delay, settings.journal_file)
    bot = EventDispatcher(
        state, on_lock_conflict="queue", lock_ttl=settings.lock_ttl, raise_errors=False
    )

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
        file: where each handled message id is also appended, one line each, as soon as it is
            handled (``None``: nowhere); lines of several processes do not interleave. Beside it,
            ``<file>.started`` gets ``<message id> <pid>`` when a handler starts (which process
            is handling what, for a demo or a test that stops one mid-handler).
    """

    def __init__(self, delay: float = 0.0, file: str | None = None) -> None:
        self.delay = delay
        self.file = file
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
        if self.file is not None:
            _append_line(f"{self.file}.started", f"{event.message_id} {os.getpid()}\n")
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
            if self.file is not None:
                _append_line(self.file, f"{event.message_id}\n")
        finally:
            self.running[key] -= 1
            if not self.running[key]:
                del self.running[key]
            self._touch()

    def snapshot(self, bot: EventDispatcher | None) -> dict[str, object]:
        """This worker's part of ``GET /stats`` (named by :data:`WORKER`)."""
        return {
            "worker": WORKER,
            "deliveries": self.deliveries,
            "handled": [h.message_id for h in self.handled],
            "running": dict(self.running),
            "most_per_key": self.most_per_key,
            "outcomes": {} if bot is None else {o.value: n for o, n in bot.stats.items()},
        }


def _append_line(path: str, line: str) -> None:
    # one O_APPEND write per line: whole lines, whatever other processes append meanwhile, and
    # on disk before the answer (a worker killed later keeps what it wrote)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
