"""The inbox's hand-out inside one process (``MemoryState``): offered keys and waiting workers.

A key with work and no holder is *offered* once (appended to :attr:`Handout.offered`), and one
worker waiting in :meth:`MemoryWorker.next` is woken for it, not all of them. The worker takes
the key in one step under the state's mutex (``MemoryInbox.hand_out`` of ``_memory_inbox.py``),
so two workers never get the same key. Everything here runs with the state's mutex held, except
the waits.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING

from asynclock.state._watch import EventWatch

if TYPE_CHECKING:
    import threading
    from collections.abc import Callable

    from asynclock.state._protocol import InboxGrant

__all__ = ["Handout", "MemoryWorker"]


class Handout:
    """The offered keys of one state, oldest first, and the workers waiting for one.

    Invariant: a key is in :attr:`offered` at most once (``_queued``); a worker is woken only
    when a key was offered, and only one per key.
    """

    __slots__ = ("_queued", "idle", "offered")

    def __init__(self) -> None:
        self.offered: deque[str] = deque()
        self._queued: set[str] = set()
        #: workers waiting in :meth:`MemoryWorker.next`, the longest waiting first
        self.idle: deque[MemoryWorker] = deque()

    def offer(self, key: str) -> None:
        """Offer ``key`` (it has work and no holder) and wake one waiting worker."""
        if key in self._queued:
            return  # offered already, and a worker woken for it
        self._queued.add(key)
        self.offered.append(key)
        if self.idle:
            self.idle.popleft().wake()

    def pop(self) -> str | None:
        """The oldest offered key, taken off the offer (``None``: nothing offered)."""
        if not self.offered:
            return None
        key = self.offered.popleft()
        self._queued.discard(key)
        return key


class MemoryWorker:
    """One ``serve()``'s place in a :class:`Handout` (see :class:`~asynclock.state.InboxWorker`)."""

    __slots__ = ("_handout", "_mutex", "_take", "_watch")

    def __init__(
        self,
        handout: Handout,
        mutex: threading.Lock,
        take: Callable[[str | None], InboxGrant | None],
    ) -> None:
        self._handout = handout
        self._mutex = mutex
        #: ``take(None)``: take an offered key; ``take(key)``: that key if it has work and no
        #: holder (the state's steps, to be called with the mutex held)
        self._take = take
        self._watch = EventWatch(asyncio.get_running_loop())

    def wake(self) -> None:
        """A key was offered for this worker (called with the mutex held, from any thread)."""
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        self._watch.notify(current)

    async def next(self, timeout: float) -> InboxGrant | None:
        """See :meth:`asynclock.state.InboxWorker.next`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        await asyncio.sleep(0)  # the yield rule
        while True:
            with self._mutex:
                grant = self._take(None)
                if grant is None:
                    self._watch.reset()
                    self._handout.idle.append(self)
            if grant is not None:
                return grant
            try:
                woken = await self._watch.wait(deadline - loop.time())
            finally:
                with self._mutex:
                    if self in self._handout.idle:
                        self._handout.idle.remove(self)
            if not woken:
                return None

    async def take(self, key: str) -> InboxGrant | None:
        """See :meth:`asynclock.state.InboxWorker.take`."""
        await asyncio.sleep(0)  # the yield rule
        with self._mutex:
            return self._take(key)

    def close(self) -> None:
        """Leave the hand-out (the ``serve()`` ended)."""
        with self._mutex:
            if self in self._handout.idle:
                self._handout.idle.remove(self)
