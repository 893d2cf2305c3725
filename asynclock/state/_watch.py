"""The Watch objects shared by the backends (an event that a release notification sets), and
the registry a state's listener finds them in."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, TypeVar

from asynclock._compat import deadline_after

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator

K = TypeVar("K", bound="Hashable")
W = TypeVar("W")


@contextlib.contextmanager
def registered(watches: dict[K, set[W]], where: K, watch: W) -> Iterator[W]:
    """``watch`` in ``watches[where]`` while the block runs (the entry goes with its last
    watch): where a state's listener finds the watches to wake."""
    watches.setdefault(where, set()).add(watch)
    try:
        yield watch
    finally:
        others = watches.get(where)
        if others is not None:
            others.discard(watch)
            if not others:
                del watches[where]


class EventWatch:
    """Release notifications for one key, delivered to the event loop that created the watch.

    ``notify`` may be called from any thread; it crosses threads with ``call_soon_threadsafe``.
    """

    __slots__ = ("_event", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()

    def fire(self) -> None:
        """Set the event; call only from the watch's own loop."""
        self._event.set()

    def heard(self, payload: object) -> None:
        """A message on the watched channel, with its ``payload``: wake the waiter (any
        message does; :class:`OwnerWatch` looks at the payload). From the watch's own loop."""
        self._event.set()

    def notify(self, current: asyncio.AbstractEventLoop | None) -> None:
        """Set the event from ``current`` (the caller's running loop, or ``None``)."""
        if current is self._loop:
            self._event.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    def reset(self) -> None:
        """Forget notifications received so far."""
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        """``True`` when notified since the last :meth:`reset`, ``False`` after ``timeout``."""
        if self._event.is_set():
            await asyncio.sleep(0)
            return True
        try:
            async with deadline_after(max(timeout, 0.0)):
                await self._event.wait()
        except (TimeoutError, asyncio.TimeoutError):
            return False
        return True


class OwnerWatch(EventWatch):
    """An :class:`EventWatch` that a channel message wakes only when it names ``owner``.

    For channels shared by many waiters of whom a message concerns a few (a semaphore's
    release wakes the waiters it made eligible): the payload is the owner ids it concerns,
    separated by spaces (owner ids hold no whitespace). :meth:`fire` (a reconnect, a local
    release) still wakes it unconditionally, so it never misses more than a plain watch would.
    """

    __slots__ = ("_owner",)

    def __init__(self, loop: asyncio.AbstractEventLoop, owner: str) -> None:
        super().__init__(loop)
        self._owner = owner

    def heard(self, payload: object) -> None:
        """Wake when ``payload`` (bytes or str) names this watch's owner."""
        text = payload.decode() if isinstance(payload, bytes) else str(payload)
        if self._owner in text.split(" "):
            self._event.set()


class TokenWatch(EventWatch):
    """Supersede signals for one key (:class:`~asynclock.state.SupersedeWatch`): it wakes once a
    signal names the fencing token it aims at.

    Subscribed before the lock is taken, so a signal that arrives before :meth:`aim` (the
    token is not known yet) is remembered and counts once aimed. A payload is tokens separated
    by spaces. :meth:`fire` (a reconnect, which wakes release watchers so they re-check) does
    nothing here: a supersede signal is never guessed; its sender sends it again while waiting.
    """

    __slots__ = ("_heard", "_token")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._heard: set[int] = set()
        self._token: int | None = None

    def fire(self) -> None:
        """A reconnect of the channel: nothing to wake (see the class)."""

    def heard(self, payload: object) -> None:
        """A signal naming the tokens in ``payload`` (bytes or str). From the watch's loop."""
        text = payload.decode() if isinstance(payload, bytes) else str(payload)
        for part in text.split():
            if part.isdigit():
                self._heard.add(int(part))
        if self._token is not None and self._token in self._heard:
            self._event.set()

    def deliver(self, payload: str, current: asyncio.AbstractEventLoop | None) -> None:
        """:meth:`heard` from any thread (``current``: the caller's running loop, or ``None``)."""
        if current is self._loop:
            self.heard(payload)
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.heard, payload)

    def aim(self, token: int) -> None:
        """Wake for signals naming ``token``, including those heard already."""
        self._token = token
        self._heard = {heard for heard in self._heard if heard >= token}
        if token in self._heard:
            self._event.set()
