"""The durable inbox: ``EventDispatcher.accept`` stores events, ``serve`` drains them in order.

An accepted event is an entry in its lock key's inbox in the state (:class:`InboxState`). A
worker drains a key while holding the key's lock: one entry at a time, in accept order; an
entry leaves the inbox only once its handlers returned (or it was dead-lettered after
``max_attempts``), in the same atomic step that hands out the next one, or releases the lock
when there is none (release-if-empty). A worker that dies mid-handler leaves the entry at the
head; once its lock's TTL ran out, another worker takes the key over and delivers the entry
again with ``ctx.attempt`` one higher. Under ``latest`` and ``debounce`` a held key is drained
by batches instead (``_inbox/fold.py``), with the same crash-safety per handler call.

The hand-out: a key with work and no holder goes to **one** worker
(:meth:`InboxState.inbox_worker`), which gets it with the key's lock held for it already (on
Redis the accept reserves the lock and queues the grant; on the SQL states the accept wakes one
worker, which takes the key), so the cost of an event does not grow with the number of workers.
Every few seconds each worker also rescans the keys with work whose lock is free: the safety
net that finds a key whose worker died, or whose grant was lost on its way.

Retries that wait (``retry_wait``, ``_inbox/retry.py``): a failed entry is kept at its key's
head in the state with a due time, and the lock released in the same step; the worker sets a
local timer that takes the key once it is due (the rescan delivers it if that worker died).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Protocol, TypeVar

from asynclock import metrics as _metrics
from asynclock._backoff import Backoff
from asynclock._errors import LockLostError, LockNotOwnedError, StateUnavailableError
from asynclock._events.codec import decode
from asynclock._events.event import HandlerContext, Outcome
from asynclock._events.handlers import call_all
from asynclock._inbox.retry import RetryPlan
from asynclock._lock.acquisition import Acquisition
from asynclock._owner import new_owner
from asynclock._validate import check_key
from asynclock.metrics._active import active

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from asynclock._events.event import Recorder
    from asynclock._events.handlers import HandlerTable
    from asynclock.state._protocol import (
        InboxEntry,
        InboxGrant,
        InboxState,
        InboxWorker,
        State,
    )


logger = logging.getLogger("asynclock")

T = TypeVar("T")

#: seconds between two rescans of the keys with work (also bounded by ``lock_ttl / 2``)
RESCAN = 5.0
#: keys one ``serve()`` drains at once by default (``serve(max_keys=...)``)
MAX_KEYS = 64
#: the lock key whose holder rescans for the deployment this interval (a name no thread key of
#: the built-in lock scopes takes: they read "adapter:channel:thread")
RESCAN_TURN = "asynclock.inbox.rescan"
#: what the dead-letter log line adds under ``on_poison="park"``
PARKED = " (key parked until `asynclock inbox requeue` or `discard`)"


class KeyDrain(Protocol):
    """How a held key is drained instead of one entry at a time: the batches of ``latest`` /
    ``debounce`` (``_inbox_fold.FoldingDrain``) or the interruptions of ``supersede``
    (``_inbox_supersede.SupersedingDrain``). The drainer holds the key's lock when it calls."""

    async def drain(self, key: str, lock: Acquisition, stopping: asyncio.Event) -> float | None:
        """Drain ``key`` until its inbox is empty (the lock released by the step that found it
        so) or ``stopping`` is set (the caller releases the lock); the seconds the key waits for
        a retry in the state (its lock released), else ``None``."""
        ...


class Drainer:
    """One ``serve()``: takes the keys handed to it and drains each in a task of its own.

    Invariants: this worker drains a key in at most one task at a time (a grant for a key whose
    previous task is still winding down waits for that task), and at most ``max_keys`` keys at
    once (it asks for no grant while it has that many: they go to other workers); a grant is always drained, even
    once stopping (the entry in hand is finished); the rescan (:meth:`_rescan`) is the safety
    net only, never on the path of an event: it takes the keys that no hand-out reached (their
    worker died, or the grant was lost on its way) once their lock is free.
    """

    __slots__ = (
        "_folding",
        "_handlers",
        "_inbox",
        "_keys",
        "_lock_ttl",
        "_max_attempts",
        "_max_keys",
        "_observe",
        "_record",
        "_retry",
        "_room",
        "_state",
        "_stopping",
        "_timers",
        "_worker",
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
        folding: KeyDrain | None = None,
        max_keys: int = MAX_KEYS,
        retry: RetryPlan | None = None,
    ) -> None:
        self._state = state
        #: ``retry_wait`` and ``on_poison`` (the default: short in-lock retries, dead letters)
        self._retry = retry if retry is not None else RetryPlan()
        #: the local timers of the retries that wait (cancelled when the serve() ends)
        self._timers: set[asyncio.TimerHandle] = set()
        self._worker: InboxWorker | None = None
        self._stopping: asyncio.Event | None = None
        #: keys drained at once at most: grants beyond are left to the other workers
        self._max_keys = max_keys
        self._room = asyncio.Event()
        #: ``latest`` / ``debounce``: how a held key is drained instead of one entry at a time
        self._folding = folding
        self._inbox = inbox
        self._handlers = handlers
        self._lock_ttl = lock_ttl
        self._max_attempts = max_attempts
        self._record = record
        #: told how long each successful handling of a key took (the dispatcher's estimates)
        self._observe = observe
        self._keys: dict[str, asyncio.Task[None]] = {}

    async def run(self, stopping: asyncio.Event) -> None:
        """Drain until ``stopping`` is set, then let each key finish the entry in hand."""
        interval = min(RESCAN, self._lock_ttl / 2)
        try:
            while not stopping.is_set():
                # a worker rides out a state that is down: joining the hand-out (registering,
                # listening) is tried again until it works or the worker stops, never the end
                # of serve() (what it joined is left again when it fails, by its own exit)
                handout = self._inbox.inbox_worker(
                    lock_ttl=self._lock_ttl, with_entry=self._folding is None
                )
                try:
                    async with handout as worker:
                        self._worker, self._stopping = worker, stopping
                        await self._take_grants(worker, interval, stopping)
                except StateUnavailableError as exc:
                    if stopping.is_set():
                        return
                    self._worker = None
                    logger.warning("asynclock: joining the inbox's hand-out failed: %s", exc)
                    await _unless(asyncio.sleep(min(interval, 1.0)), stopping)
        finally:
            self._worker = None  # no timer takes a key any more (a drain ending now sets none)
            for timer in self._timers:  # their keys are in the state: the rescan finds them
                timer.cancel()
            self._timers.clear()
            drainers = tuple(self._keys.values())
            if not stopping.is_set():  # cancelled: the drainers go too (their entries stay)
                for task in drainers:
                    task.cancel()
            await asyncio.gather(*drainers, return_exceptions=True)

    async def _take_grants(
        self, worker: InboxWorker, interval: float, stopping: asyncio.Event
    ) -> None:
        """Start a drainer for each key handed to ``worker`` (and rescanned), until stopping."""
        rescans = asyncio.ensure_future(self._rescan_every(worker, interval, stopping))
        try:
            while not stopping.is_set():
                if len(self._keys) >= self._max_keys:
                    self._room.clear()
                    await _unless(self._room.wait(), stopping)
                    continue
                try:
                    grant = await _unless(worker.next(interval), stopping)
                except StateUnavailableError as exc:
                    logger.warning("asynclock: waiting for inbox work failed: %s", exc)
                    await _unless(asyncio.sleep(min(interval, 1.0)), stopping)
                    continue
                if grant is not None:
                    self._start(grant.key, self._drain_granted(grant, stopping))
        finally:
            rescans.cancel()
            await asyncio.gather(rescans, return_exceptions=True)

    def _start(self, key: str, drain: Coroutine[object, object, None]) -> None:
        """Drain ``key`` in a task of its own, after the task still draining it here, if any."""
        before = self._keys.get(key)
        task = asyncio.ensure_future(drain if before is None else _after(before, drain))
        task.set_name(f"asynclock inbox {key!r}")
        self._keys[key] = task
        task.add_done_callback(functools.partial(self._gone, key))

    def _gone(self, key: str, task: asyncio.Task[None]) -> None:
        if self._keys.get(key) is task:
            del self._keys[key]
            self._room.set()

    async def _rescan_every(
        self, worker: InboxWorker, interval: float, stopping: asyncio.Event
    ) -> None:
        """The safety net: every ``interval`` seconds, take the keys no hand-out reached.

        Not at once: a worker that starts gets the keys waiting for it through the hand-out
        (grants queued for it, or its first claim), as their first delivery. A key found is
        taken as a hand-out takes it (:meth:`InboxWorker.take`), and drained as its grant.

        One worker of the deployment rescans per interval, not each of them: the turn is a
        lock (:data:`RESCAN_TURN`) taken without waiting for a little less than the interval,
        so the cost of the safety net does not grow with the number of workers (each pays one
        try per interval), and the turn passes to another worker when its holder is gone.
        """
        owner = new_owner()
        while not stopping.is_set():
            await _unless(asyncio.sleep(interval), stopping)
            if stopping.is_set():
                return
            try:
                turn = await self._state.acquire(RESCAN_TURN, owner, interval * 0.9)
                if turn.token is None:
                    continue  # another worker rescans this time
                ready = await self._inbox.inbox_ready()
                for key in ready:
                    if len(self._keys) >= self._max_keys or stopping.is_set():
                        break
                    if key in self._keys:
                        continue
                    grant = await worker.take(key)
                    if grant is not None:  # (maybe another key: _start chains a busy one)
                        self._start(grant.key, self._drain_granted(grant, stopping))
            except StateUnavailableError as exc:
                logger.warning("asynclock: inbox rescan failed: %s", exc)

    async def _drain_granted(self, grant: InboxGrant, stopping: asyncio.Event) -> None:
        """Drain the key of ``grant``, whose lock the hand-out holds for us already."""
        lock = Acquisition(self._state, check_key(grant.key), self._lock_ttl, auto_renew=True)
        # as if acquired ``lock_ttl`` before it expires: the renewals keep to that schedule
        since = asyncio.get_running_loop().time() + grant.expires_in - self._lock_ttl
        lock.hold_granted(grant.owner, grant.token, since)
        try:
            await self._drain(grant.key, lock, stopping, grant.entry)
        except (StateUnavailableError, LockNotOwnedError) as exc:
            logger.warning("asynclock: draining inbox %r stopped: %s", grant.key, exc)

    async def _drain(
        self, key: str, lock: Acquisition, stopping: asyncio.Event, first: InboxEntry | None
    ) -> None:
        try:
            async with lock.holding():
                if self._folding is not None:
                    retry_in = await self._folding.drain(key, lock, stopping)
                else:
                    retry_in = await self._drain_held(key, lock, stopping, first)
        except LockLostError:
            logger.warning("asynclock: lost the lock of inbox %r; its entry is redelivered", key)
            return
        if retry_in is not None:
            self._retry_later(key, retry_in)

    def _retry_later(self, key: str, retry_in: float) -> None:
        """Take ``key`` again once its retry is due (``retry_in`` seconds from the step that
        set it): a local timer, so the retry comes on time without holding the key meanwhile;
        the rescan is the safety net if this worker is gone by then."""
        if self._worker is None:
            return  # this serve() ended: the key waits in the state for another worker
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def fire() -> None:
            assert timer is not None
            self._timers.discard(timer)
            if self._worker is None or self._stopping is None or self._stopping.is_set():
                return  # stopped: the key waits in the state for another worker
            if len(self._keys) >= self._max_keys:
                self._retry_later(key, 0.5)  # full: a little later (or another worker's rescan)
                return
            # as the key's drain task: counted in max_keys, awaited when the serve() ends
            self._start(key, self._take_due(key))

        timer = loop.call_later(RetryPlan.timer_delay(retry_in), fire)
        self._timers.add(timer)

    async def _take_due(self, key: str) -> None:
        """Take ``key``, whose retry is due now, and drain what that gives (maybe nothing: another
        worker's rescan or an accept took it first)."""
        worker, stopping = self._worker, self._stopping
        if worker is None or stopping is None or stopping.is_set():
            return
        try:
            grant = await worker.take(key)
        except StateUnavailableError as exc:
            logger.warning("asynclock: taking inbox %r for its retry failed: %s", key, exc)
            return  # the rescan takes it once the state answers
        if grant is None:
            return
        if grant.key == key:
            await self._drain_granted(grant, stopping)
        else:  # another key with work, handed out instead (a backend may): its own task
            self._start(grant.key, self._drain_granted(grant, stopping))

    async def _drain_held(
        self, key: str, lock: Acquisition, stopping: asyncio.Event, entry: InboxEntry | None
    ) -> float | None:
        """Handle ``key``'s entries one at a time; ``entry``: the head, handed out already.

        Returns the seconds its head waits for a retry in the state (the step that set the
        wait released the lock), else ``None``.
        """
        done: int | None = None
        dead: str | None = None
        backoff = Backoff()
        while True:
            if entry is None:
                take = not stopping.is_set()
                entry = await self._inbox.inbox_step(
                    key, lock.owner, done=done, dead=dead, take=take
                )
                if entry is None:
                    lock.released_by_step()  # the step released it: the inbox was empty
                    return None
                if not take:
                    return None  # stopping: leaving `async with` releases the lock
            done, dead = await self._handle(key, lock, entry)
            if done is None:
                retry_in = self._retry.retry_in(key, entry.attempt)
                if retry_in is not None:
                    # the entry waits in the state, holding nothing: the lock goes in this step
                    await self._inbox.inbox_step(key, lock.owner, done=entry.id, retry_in=retry_in)
                    lock.released_by_step()
                    return retry_in
                await backoff.failed()
            elif dead is not None and self._retry.park:
                # the key stops at its poison: parked, the lock released in this step
                await self._inbox.inbox_step(key, lock.owner, done=done, dead=dead, park=True)
                lock.released_by_step()
                return None
            else:
                backoff.succeeded()
            entry = None

    async def _handle(
        self, key: str, lock: Acquisition, entry: InboxEntry
    ) -> tuple[int | None, str | None]:
        """Deliver ``entry``; returns what the next step does with it (done, dead-letter, retry)."""
        event = decode(entry.payload)
        if active.sink is not None:
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
            if active.sink is not None:
                _metrics.report("inbox_dead_letter", key)
            logger.error(
                "asynclock: inbox entry %s of %r dead-lettered after %d attempts%s: %s",
                event.message_id,
                key,
                entry.attempt,
                PARKED if self._retry.park else "",
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


async def _unless(work: Awaitable[T], stopping: asyncio.Event) -> T | None:
    """``work``'s result, or ``None`` if ``stopping`` was set first (``work`` is cancelled).

    A result that ``work`` produced anyway wins over the stop: a grant in hand is drained.
    """
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, stopped, return_exceptions=True)
    if task.cancelled():
        return None
    return task.result()


async def _after(before: asyncio.Task[None], drain: Coroutine[object, object, None]) -> None:
    """Run ``drain`` once ``before`` (the key's previous drain here) has ended."""
    try:
        await asyncio.wait((before,))
    except BaseException:
        drain.close()
        raise
    await drain
