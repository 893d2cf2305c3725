"""supersede: a newer event interrupts the running call of its key, then is handled with it.

The dispatcher's ``on_lock_conflict="supersede"`` (SPEC 10). Per key and process, a
:class:`SupersedeLine` holds the events waiting and the call running; its drainer
(:func:`drain`) takes the key's lock, handles the newest event with every other one in
``ctx.skipped``, and lets a newer arrival interrupt the call:

* from this process, directly (:meth:`SupersedeLine.arrive`);
* from another process, through the state's :class:`~asynclock.state.SupersedeSignals` push:
  the drainer subscribes before it takes the lock and aims the subscription at its fencing
  token; a drainer that finds the key held signals the holder's token, again every time it
  checks the key while it waits (a lost signal is made up for by the next one).

Interrupting sets ``ctx.superseded`` at once and cancels the call's task ``grace`` seconds later
(``None``: never). The lock is released only once the call's task has ended, whatever it did
with the cancellation, so a shielded handler never runs beside the newer call.

Timeline of one key (events A, B, C; A's call interrupted by B; C arrives meanwhile)::

    A arrives        lock taken (token 7), call(A) runs
    B arrives        call(A): ctx.superseded set; cancelled after `grace`
    C arrives        (call(A) is interrupted already)
    call(A) ends     lock released; A carried on
    lock taken (8)   call(C, skipped=(A, B)) runs, returns
    outcomes         A: SUPERSEDED, B: SKIPPED, C: QUEUED

Outcomes resolve when the call that covers them returns; a failure of that call fails them
all (their dedupe records are forgotten, so redeliveries run). An interrupted call whose newer
event arrived in *another* process hands its events over before it releases the key
(:meth:`~asynclock.state.SupersedeSignals.supersede_carry`): the newer call, which takes the key
next, collects them and has them first in its ``ctx.skipped``. Those events end
SUPERSEDED/SKIPPED once handed over, since their covering call runs in the other process (the
durable inbox is the form that acknowledges only when the covering call returned).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from asynclock._errors import LockAcquisitionError
from asynclock._events.codec import decode, encode
from asynclock._events.event import Event, HandlerContext, Outcome
from asynclock._events.handlers import call_all
from asynclock._lock.lock import AsyncLock
from asynclock.state._protocol import SupersedeSignals

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from asynclock._events.handlers import HandlerTable
    from asynclock.state._protocol import State, SupersedeWatch

__all__ = ["Running", "SupersedeLine", "Waiting", "drain", "take_lock"]

logger = logging.getLogger("asynclock")


class Waiting:
    """An event of a supersede line and the future its dispatch waits on."""

    __slots__ = ("event", "future", "queued", "ready", "superseded")

    def __init__(self, event: Event, future: asyncio.Future[Outcome]) -> None:
        self.event = event
        self.future = future
        #: its dedupe claim is recorded (till then it holds its place in the line only)
        self.ready = False
        #: it waited for the key (another call ran or held it): QUEUED, not HANDLED, if handled
        self.queued = False
        #: its own call was interrupted: SUPERSEDED (not SKIPPED) once covered
        self.superseded = False


class Running:
    """The call running for a key in this process, which a newer event interrupts."""

    __slots__ = ("_cancel_at", "ctx", "from_afar", "grace", "interrupted", "task")

    def __init__(self, ctx: HandlerContext, task: asyncio.Task[None], grace: float | None) -> None:
        self.ctx = ctx
        self.task = task
        self.grace = grace
        self.interrupted = False
        #: a signal from another process interrupted it (its newer event is there)
        self.from_afar = False
        self._cancel_at: asyncio.TimerHandle | None = None

    def interrupt(self) -> None:
        """Set ``ctx.superseded`` now; cancel the task ``grace`` seconds later. Idempotent."""
        if self.interrupted:
            return
        self.interrupted = True
        self.ctx.superseded.set()
        if self.grace is None or self.task.done():
            return
        if self.grace == 0:
            self.task.cancel()
        else:
            self._cancel_at = asyncio.get_running_loop().call_later(self.grace, self.task.cancel)

    def ended(self) -> None:
        """The task is done: no cancellation is due any more."""
        if self._cancel_at is not None:
            self._cancel_at.cancel()
            self._cancel_at = None


class SupersedeLine:
    """The events of one key under ``supersede`` in this process, and its running call."""

    __slots__ = ("carried", "drainer", "entries", "running")

    def __init__(self) -> None:
        #: arrived and not yet taken into a call, in arrival order
        self.entries: list[Waiting] = []
        #: covered by an interrupted call: the next call covers them (before ``entries``)
        self.carried: list[Waiting] = []
        self.drainer: asyncio.Task[object] | None = None
        self.running: Running | None = None

    def arrive(self, waiting: Waiting) -> None:
        """An event takes its place in the line, on arrival (before its claim is recorded)."""
        self.entries.append(waiting)

    def leave(self, waiting: Waiting) -> None:
        """An event gives its place up (a duplicate, or its claim failed)."""
        if waiting in self.entries:
            self.entries.remove(waiting)

    def ready(self, waiting: Waiting) -> None:
        """The event's claim is recorded: it interrupts the call running here, if any."""
        waiting.ready = True
        waiting.queued = self.drainer is not None
        if self.running is not None:
            self.running.interrupt()

    def pending(self) -> bool:
        """Whether a claimed event still waits for a call (a cancelled dispatch no longer)."""
        return any(w.ready and not w.future.done() for w in self.entries)


async def take_lock(
    state: State, key: str, ttl: float, signals: SupersedeSignals | None
) -> tuple[AsyncLock, bool]:
    """Take ``key``'s lock (renewed while held), signalling each holder met on the way.

    The first attempt does not wait. While the key is held, the holder (named by its fencing
    token) is signalled, and the wait for the key's release (a push too, see
    :meth:`State.watch`) is cut into slices of ``min(1, ttl/3)`` seconds: after each, the
    holder is signalled again, so a lost signal, or a holder that took the key from another
    waiter meanwhile, is reached within a slice. Returns the lock and whether it was waited for.
    """
    slice_ = min(1.0, ttl / 3)
    blocking = False
    while True:
        lock = AsyncLock(state, key, ttl, blocking=blocking, timeout=slice_, auto_renew=True)
        try:
            return await lock.__aenter__(), blocking
        except LockAcquisitionError:
            pass
        blocking = True
        if signals is not None:
            holder = await state.inspect(key)
            if holder is not None:
                await signals.supersede(key, holder.token)


async def _listen(watch: SupersedeWatch, running: Running) -> None:
    """Interrupt ``running`` when a signal for its token comes from another process."""
    while not await watch.wait(3600.0):
        pass
    running.from_afar = True
    running.interrupt()


async def _run(
    line: SupersedeLine,
    handlers: HandlerTable,
    event: Event,
    ctx: HandlerContext,
    watch: SupersedeWatch | None,
    grace: float | None,
) -> tuple[Running, BaseException | None]:
    """Run the call in a task of its own, interruptible; (the run, its exception)."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(call_all(handlers.for_type(event.type), event, ctx))
    running = line.running = Running(ctx, task, grace)
    if line.pending():  # a newer event came while the lock was being taken
        running.interrupt()
    listener = loop.create_task(_listen(watch, running)) if watch is not None else None
    try:
        try:
            await asyncio.wait((task,))
        except asyncio.CancelledError:
            # the drainer itself is cancelled (its lock lost, say): the call goes with it, and
            # the lock is released only once the call's task has ended
            task.cancel()
            await asyncio.wait((task,))
            raise
    finally:
        line.running = None
        running.ended()
        if listener is not None:
            listener.cancel()
            await asyncio.wait((listener,))
    error = None if task.cancelled() else task.exception()
    if task.cancelled() and not running.interrupted:
        error = asyncio.CancelledError()
    return running, error


def _resolve(covered: list[Waiting], handled: Waiting | None, error: BaseException | None) -> None:
    """Give the dispatches of one completed call their outcomes (or its failure)."""
    for waiting in (*covered, *((handled,) if handled is not None else ())):
        future = waiting.future
        if future.done():
            continue
        if error is not None:
            if isinstance(error, Exception):
                future.set_exception(error)
            else:
                future.cancel()
        elif waiting is handled and handled is not None:
            future.set_result(Outcome.QUEUED if handled.queued else Outcome.HANDLED)
        else:
            future.set_result(Outcome.SUPERSEDED if waiting.superseded else Outcome.SKIPPED)


async def drain(
    state: State,
    key: str,
    line: SupersedeLine,
    handlers: HandlerTable,
    *,
    ttl: float,
    grace: float | None,
    carry_ttl: float,
) -> None:
    """Serve ``line`` until nothing waits: one call per round, under the key's lock.

    ``carry_ttl``: how long events handed over to another process wait in the state for the
    key's next call (see :func:`_hand_over`).
    """
    signals = state if isinstance(state, SupersedeSignals) else None
    batch: list[Waiting] = []
    #: events another process's interrupted call handed over, collected and not yet covered
    remote: list[Event] = []
    try:
        while line.pending():
            handed_over = False
            async with _subscribed(signals, key) as watch:
                lock, waited = await take_lock(state, key, ttl, signals)
                try:
                    token = lock.token
                    assert token is not None
                    if watch is not None:
                        watch.aim(token)
                    fresh = [w for w in line.entries if w.ready and not w.future.done()]
                    batch = [*line.carried, *fresh]
                    # events whose claim is on its way keep their place for the next round
                    line.entries = [w for w in line.entries if not w.ready]
                    line.carried = []
                    if not fresh:  # every newer dispatch was cancelled: nothing to run
                        _resolve(batch, None, None)
                        batch = []
                        break
                    if signals is not None:
                        remote.extend(await _collect(signals, key))
                    handled = batch[-1]
                    handled.queued = handled.queued or waited or len(batch) > 1 or bool(remote)
                    skipped = (*remote, *(waiting.event for waiting in batch[:-1]))
                    ctx = HandlerContext(key, token, skipped)
                    run, error = await _run(line, handlers, handled.event, ctx, watch, grace)
                    interrupted = run.interrupted
                    if run.from_afar and not line.pending() and signals is not None:
                        # the newer event is in another process: its call, which takes the
                        # key next, covers this call's events
                        events = (*remote, *(waiting.event for waiting in batch))
                        await _hand_over(signals, key, events, carry_ttl)
                        remote = []
                        handed_over = True
                finally:
                    await lock.__aexit__(None, None, None)
            if interrupted:
                handled.superseded = True
                line.carried = batch
                if handed_over or not line.pending():
                    _resolve(batch, None, None)
                    line.carried = []
            else:
                _resolve(batch[:-1], handled, error)
                if error is not None and remote:
                    logger.warning(
                        "asynclock: the call covering %d event(s) handed over from another "
                        "process for key %r failed; they are not handled again: %r",
                        len(remote),
                        key,
                        error,
                    )
                remote = []
            batch = []
    except BaseException as error:
        # the lock could not be had (state unavailable) or was lost during the call: every
        # event not concluded fails (and is forgotten by its dispatch)
        for waiting in (*batch, *line.carried, *line.entries):
            if not waiting.future.done():
                if isinstance(error, Exception):
                    waiting.future.set_exception(error)
                else:
                    waiting.future.cancel()
        line.carried = []
        line.entries.clear()
        if remote:
            logger.warning(
                "asynclock: %d event(s) handed over from another process for key %r are not "
                "handled: the call that had them ended with %r",
                len(remote),
                key,
                error,
            )
        if not isinstance(error, Exception):
            raise


async def _collect(signals: SupersedeSignals, key: str) -> list[Event]:
    """The events another process's interrupted call left for ``key``'s next call."""
    return [decode(payload) for payload in await signals.supersede_collect(key)]


async def _hand_over(
    signals: SupersedeSignals, key: str, events: Sequence[Event], ttl: float
) -> None:
    """Leave ``events`` in the state for ``key``'s next call (in another process), which has
    them in ``ctx.skipped``. The caller still holds the key, so they come before the events of
    that call. An event whose ``raw`` JSON cannot hold stays behind (logged): the next call
    does not see it."""
    payloads: list[str] = []
    for event in events:
        try:
            payloads.append(encode(event))
        except TypeError as exc:  # noqa: PERF203 - only on the error path
            logger.warning(
                "asynclock: superseded event %r of key %r is not handed over to the newer "
                "call in another process: %s",
                event.dedupe_key,
                key,
                exc,
            )
    await signals.supersede_carry(key, payloads, ttl)


@contextlib.asynccontextmanager
async def _subscribed(
    signals: SupersedeSignals | None, key: str
) -> AsyncIterator[SupersedeWatch | None]:
    """The state's supersede subscription for ``key``, or ``None`` without the capability."""
    if signals is None:
        yield None
        return
    async with signals.supersede_watch(key) as watch:
        yield watch
