"""The durable inbox: ``EventDispatcher.accept`` stores events, ``serve`` drains them in order.

An accepted event is an entry in its lock key's inbox in the state (:class:`InboxState`). A
worker drains a key while holding the key's lock: one entry at a time, in accept order; an
entry leaves the inbox only once its handlers returned (or it was dead-lettered after
``max_attempts``), in the same atomic step that hands out the next one, or releases the lock
when there is none (release-if-empty). A worker that dies mid-handler leaves the entry at the
head; once its lock's TTL ran out, another worker takes the key over and delivers the entry
again with ``ctx.attempt`` one higher.

Workers learn of new work by push (:meth:`InboxState.inbox_watch`) and rescan the keys with
work every few seconds, which is how a key whose drainer died is picked up again. A wake-up
whose scan finds its key still taken by a drainer of this worker (one that has just released
it on an empty inbox, but whose task has not ended yet) is not lost: that task's end triggers
a new scan.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import TYPE_CHECKING

from asynclock import metrics as _metrics
from asynclock._errors import LockLostError, LockNotOwnedError, StateUnavailableError
from asynclock._event import Event, HandlerContext, Outcome
from asynclock._handlers import call_all
from asynclock._lock import AsyncLock

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock._handlers import HandlerTable
    from asynclock.state._protocol import InboxEntry, InboxState, State

    #: ``(event, outcome, lock_key, error)``: how a drained entry's outcome is recorded
    Recorder = Callable[[Event, Outcome, str, BaseException | None], Awaitable[object]]

logger = logging.getLogger("asynclock")

#: seconds between two rescans of the keys with work (also bounded by ``lock_ttl / 2``)
RESCAN = 5.0
#: the longest pause between two deliveries of an entry whose handler failed
MAX_RETRY_PAUSE = 5.0


def encode(event: Event) -> str:
    """``event`` as the JSON text an inbox entry stores.

    Raises:
        TypeError: ``event.raw`` is not JSON-serializable (the message names the field).
    """
    fields = {
        "type": event.type,
        "adapter": event.adapter,
        "channel_id": event.channel_id,
        "thread_id": event.thread_id,
        "message_id": event.message_id,
    }
    raw = dict(event.raw)
    try:
        return json.dumps({**fields, "raw": raw}, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"accept() stores the event as JSON: {_unserializable(raw)} is not "
            f"JSON-serializable ({exc})"
        ) from exc


def _unserializable(raw: dict[str, object]) -> str:
    """Name the first field of ``raw`` that JSON cannot hold (for the error message)."""
    for name, value in raw.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError):  # noqa: PERF203 - only on the error path
            return f"Event.raw[{name!r}] ({type(value).__name__})"
    return "Event.raw"


def decode(payload: str) -> Event:
    """The event an inbox entry stores."""
    data = json.loads(payload)
    return Event(
        type=data["type"],
        adapter=data["adapter"],
        channel_id=data["channel_id"],
        thread_id=data["thread_id"],
        message_id=data["message_id"],
        raw=data["raw"],
    )


class Drainer:
    """One ``serve()``: finds the keys with work and drains each in a task of its own."""

    __slots__ = (
        "_again",
        "_handlers",
        "_inbox",
        "_keys",
        "_lock_ttl",
        "_max_attempts",
        "_observe",
        "_recheck",
        "_record",
        "_state",
    )

    def __init__(
        self,
        state: State,
        inbox: InboxState,
        handlers: HandlerTable,
        *,
        lock_ttl: float,
        max_attempts: int,
        record: Recorder,
        observe: Callable[[str, float], None],
    ) -> None:
        self._state = state
        self._inbox = inbox
        self._handlers = handlers
        self._lock_ttl = lock_ttl
        self._max_attempts = max_attempts
        self._record = record
        #: told how long each successful handling of a key took (the dispatcher's estimates)
        self._observe = observe
        self._keys: dict[str, asyncio.Task[None]] = {}
        #: keys the last scan found with work while their drainer still ran: that drainer may
        #: be past its last step (it released the lock on an empty inbox before the accept
        #: landed), so the end of its task triggers a new scan instead of waiting for a rescan
        self._again: set[str] = set()
        self._recheck = asyncio.Event()

    async def run(self, stopping: asyncio.Event) -> None:
        """Drain until ``stopping`` is set, then let each key finish the entry in hand."""
        interval = min(RESCAN, self._lock_ttl / 2)
        try:
            async with self._inbox.inbox_watch() as watch:
                while not stopping.is_set():
                    watch.reset()
                    self._recheck.clear()
                    try:
                        ready = await self._inbox.inbox_ready()
                    except StateUnavailableError as exc:
                        logger.warning("asynclock: inbox rescan failed: %s", exc)
                        ready = []
                    self._again = {key for key in ready if key in self._keys}
                    for key in ready:
                        if key not in self._keys:
                            task = asyncio.ensure_future(self._drain(key, stopping))
                            task.set_name(f"asynclock inbox {key!r}")
                            self._keys[key] = task
                            task.add_done_callback(functools.partial(self._gone, key))
                    await _first_of(watch.wait(interval), stopping.wait(), self._recheck.wait())
        finally:
            drainers = tuple(self._keys.values())
            if not stopping.is_set():  # cancelled: the drainers go too (their entries stay)
                for task in drainers:
                    task.cancel()
            await asyncio.gather(*drainers, return_exceptions=True)

    def _gone(self, key: str, _: asyncio.Task[None]) -> None:
        self._keys.pop(key, None)
        if key in self._again:
            self._again.discard(key)
            self._recheck.set()

    async def _drain(self, key: str, stopping: asyncio.Event) -> None:
        lock = AsyncLock(self._state, key, self._lock_ttl, auto_renew=True)
        try:
            if not await lock.acquire(blocking=False):
                return  # another worker drains it; if it dies, a rescan finds the key again
            async with lock._holding():
                await self._drain_held(key, lock, stopping)
        except LockLostError:
            logger.warning("asynclock: lost the lock of inbox %r; its entry is redelivered", key)
        except (StateUnavailableError, LockNotOwnedError) as exc:
            logger.warning("asynclock: draining inbox %r stopped: %s", key, exc)

    async def _drain_held(self, key: str, lock: AsyncLock, stopping: asyncio.Event) -> None:
        done: int | None = None
        dead: str | None = None
        failures = 0
        while True:
            take = not stopping.is_set()
            entry = await self._inbox.inbox_step(key, lock.owner, done=done, dead=dead, take=take)
            if entry is None:
                lock._released_by_step()  # the step released it: the inbox was empty
                return
            if not take:
                return  # stopping: leaving `async with` releases the lock, the entry stays
            done, dead = await self._handle(key, lock, entry)
            if done is None:
                failures += 1
                await asyncio.sleep(min(0.05 * 2 ** (failures - 1), MAX_RETRY_PAUSE))
            else:
                failures = 0

    async def _handle(
        self, key: str, lock: AsyncLock, entry: InboxEntry
    ) -> tuple[int | None, str | None]:
        """Deliver ``entry``; returns what the next step does with it (done, dead-letter, retry)."""
        event = decode(entry.payload)
        if _metrics._sink is not None:
            _metrics.report("inbox_entry", key, entry.pending, entry.age)
        ctx = HandlerContext(key, lock.token, attempt=entry.attempt)
        began = asyncio.get_running_loop().time()
        try:
            await call_all(self._handlers.for_type(event.type), event, ctx)
        except Exception as error:  # noqa: BLE001 - a handler's failure is an outcome
            await self._record(event, Outcome.FAILED, key, error)
            if entry.attempt < self._max_attempts:
                return None, None  # the next step hands the same entry out again
            text = f"{type(error).__name__}: {error}"
            if _metrics._sink is not None:
                _metrics.report("inbox_dead_letter", key)
            logger.error(
                "asynclock: inbox entry %s of %r dead-lettered after %d attempts: %s",
                event.message_id,
                key,
                entry.attempt,
                text,
                extra={
                    "lock_key": key,
                    "message_id": event.message_id,
                    "attempts": entry.attempt,
                    "event_type": event.type,
                },
            )
            return entry.id, text
        self._observe(key, asyncio.get_running_loop().time() - began)
        await self._record(event, Outcome.HANDLED, key, None)
        return entry.id, None


async def _first_of(*waits: Awaitable[object]) -> None:
    """Wait until the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
