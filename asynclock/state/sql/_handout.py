"""A worker's side of the inbox's hand-out on the SQL states: woken alone, it claims a key.

Each serving worker registers a row (``inbox_worker_seen``: its id, the channel it hears on,
a lease it renews) and waits on a wake-up of its own. An accept that finds its key free wakes one
live worker of the row table, at random (``inbox_wake_one``); the worker then takes a key
(``inbox_claim``): the hinted one if it is still free, else the longest waiting one, locked for
this worker in the same transaction, its head handed out. So an event costs its accept, one claim
and the drain's step, whatever the number of workers; and no worker rereads the keys with work
on every accept.

How a backend wakes a worker is its own (:class:`WakeUps`): PostgreSQL cancels the worker's
ear's ``pg_sleep`` (the key written in the worker's row; a NOTIFY on the worker's own channel,
heard on the state's LISTEN connection, when it may not: ``postgres/_ear.py``); MySQL writes the
key in the worker's row too and kills the worker's ear's wait (``mysql/_ear.py``). Either
way the ear answers only for its own worker's key, so a worker re-arming its ear never takes the
key another was woken for.

Invariants:

* A claim never waits for a row (``SKIP LOCKED``), so workers never queue behind each other; two
  claims never take one key (the lock row's update decides).
* A wake-up is never lost for good: one that reaches no live worker (its lease ran out, its
  connection dropped) leaves the key free, and the rescan (every few seconds) takes it.
* A claim that found another free key with work claims again at once (``more``), so a backlog
  drains without a wake-up per key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import TYPE_CHECKING, Protocol

from asynclock._compat import wait_set
from asynclock._errors import StateUnavailableError
from asynclock._owner import new_owner, new_process_id
from asynclock.state._protocol import InboxEntry, InboxGrant

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
    from contextlib import AbstractAsyncContextManager

__all__ = ["LEASE", "HintWatch", "SQLWorker", "WakeUps", "WakeWatch"]

logger = logging.getLogger("asynclock")

#: seconds a worker's row says it is alive; renewed every third of it
LEASE = 10.0


class WakeWatch(Protocol):
    """Where one worker's wake-ups arrive (:meth:`WakeUps.wake_ups`)."""

    #: what the worker's row names as the way to wake it (a channel; MySQL: its ear's id);
    #: it may change (an ear reconnected): the row is renewed with the current one
    channel: str

    def reset(self) -> None:
        """Forget the wake-ups received so far."""
        ...

    def waiting(self) -> None:
        """The worker took what it was woken for and waits again (its claims are done)."""
        ...

    async def wait(self, timeout: float) -> bool:
        """``True`` once woken since the last :meth:`reset`, ``False`` after ``timeout``."""
        ...

    def hint(self) -> bytes | None:
        """The id of the key the last wake-up named, if any (taken: the next call answers
        ``None`` until another wake-up)."""
        ...


class HintWatch:
    """A :class:`WakeWatch` set from the state's event loop, remembering the last key named."""

    __slots__ = ("_event", "_hint", "channel", "idle")

    def __init__(self, channel: str = "") -> None:
        self.channel = channel
        self._event = asyncio.Event()
        self._hint: bytes | None = None
        #: set while the worker waits with its claims done (see :meth:`waiting`)
        self.idle = asyncio.Event()

    def wake(self, hint: bytes | None = None) -> None:
        """A wake-up (naming key ``hint``, if any)."""
        if hint is not None:
            self._hint = hint
        self.idle.clear()
        self._event.set()

    def waiting(self) -> None:
        """See :meth:`WakeWatch.waiting`."""
        self.idle.set()

    def reset(self) -> None:
        """See :meth:`WakeWatch.reset`."""
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        """See :meth:`WakeWatch.wait`."""
        if self._event.is_set():
            return True
        if timeout <= 0:
            return False
        return await wait_set(self._event, timeout)

    def hint(self) -> bytes | None:
        """See :meth:`WakeWatch.hint`."""
        hint, self._hint = self._hint, None
        return hint


class WakeUps(Protocol):
    """What a SQL backend supplies to the hand-out: how one worker is woken."""

    def wake_ups(self, worker: str, channel: str) -> AbstractAsyncContextManager[WakeWatch]:
        """Hear the wake-ups of ``worker`` while in the context (``channel``: a name for them
        the backend may use; the watch's ``channel`` is what the worker's row names)."""
        ...


class SQLWorker:
    """One ``serve()``'s place in the hand-out of a SQL state (see the module)."""

    __slots__ = (
        "_again",
        "_claim",
        "_key_id",
        "_lock_ttl",
        "_seen",
        "_watch",
        "_with_entry",
        "channel",
        "id",
    )

    def __init__(
        self,
        *,
        claim: Callable[[str, float, bool, bytes | None], Awaitable[Sequence[object]]],
        seen: Callable[[str, str, float], Awaitable[object]],
        key_id: Callable[[str], bytes],
        lock_ttl: float,
        with_entry: bool,
        channel_prefix: str,
    ) -> None:
        """``claim(owner, ttl, take, hint)``: the ``inbox_claim`` row; ``seen(worker, channel,
        lease)``: ``inbox_worker_seen``; ``key_id(key)``: the id of a key's rows."""
        self.id = new_process_id()
        # a PostgreSQL channel is an identifier: at most 63 bytes
        self.channel = f"{channel_prefix[:40]}inbox_{secrets.token_hex(8)}"
        self._claim = claim
        self._seen = seen
        self._key_id = key_id
        self._lock_ttl = lock_ttl
        self._with_entry = with_entry
        self._watch: WakeWatch | None = None
        #: claim without waiting for a wake-up: at the start, and while claims find more work
        self._again = True

    async def next(self, timeout: float) -> InboxGrant | None:
        """See :meth:`asynclock.state.InboxWorker.next`."""
        watch = self._watch
        assert watch is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._again:
                watch.reset()
                grant = await self._take(watch.hint())
                if grant is not None:
                    return grant
                self._again = False
            watch.waiting()
            if not await watch.wait(deadline - loop.time()):
                return None
            self._again = True

    async def take(self, key: str) -> InboxGrant | None:
        """See :meth:`asynclock.state.InboxWorker.take` (one claim with ``key`` as its hint: it
        may take another free key with work instead)."""
        return await self._take(self._key_id(key))

    async def _take(self, hint: bytes | None) -> InboxGrant | None:
        """One claim (``None``: no free key with work); ``self._again`` says whether there is
        more."""
        loop = asyncio.get_running_loop()
        sent = loop.time()
        owner = new_owner()
        row = await self._claim(owner, self._lock_ttl, self._with_entry, hint)
        status, name, token, entry, attempts, payload, age, pending, more = row
        if _text(status) != "taken":
            return None
        self._again = _bool(more)
        handed = None
        if entry is not None and self._with_entry:
            handed = InboxEntry(
                _int(entry), _int(attempts), _text(payload), float(_text(age)), _int(pending)
            )
        expires_in = self._lock_ttl - (loop.time() - sent)
        return InboxGrant(_text(name), owner, _int(token), expires_in, handed)

    @contextlib.asynccontextmanager
    async def registered(
        self,
        wake_ups: AbstractAsyncContextManager[WakeWatch],
        gone: Callable[[str], Awaitable[object]],
    ) -> AsyncIterator[SQLWorker]:
        """This worker in the hand-out: hearing its wake-ups, its row registered and renewed,
        and removed again at the end (``gone(worker id)``: ``inbox_worker_gone``)."""
        async with wake_ups as watch:
            self._watch = watch
            await self._seen(self.id, watch.channel, LEASE)
            renewal = asyncio.ensure_future(self._renew())
            try:
                yield self
            finally:
                renewal.cancel()
                await asyncio.gather(renewal, return_exceptions=True)
                with contextlib.suppress(StateUnavailableError):
                    await gone(self.id)

    async def _renew(self) -> None:
        """Keep this worker's row alive (every third of its lease)."""
        while True:
            await asyncio.sleep(LEASE / 3)
            assert self._watch is not None
            try:
                await self._seen(self.id, self._watch.channel, LEASE)
            except StateUnavailableError as exc:
                logger.warning("asynclock: renewing an inbox worker's lease failed: %s", exc)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _int(value: object) -> int:
    return int(_text(value))


def _bool(value: object) -> bool:
    if isinstance(value, (bool, int)):
        return bool(value)
    return _text(value).lower() in ("1", "t", "true")
