"""The PostgreSQL state's LISTEN connection: one per state, it wakes the watchers a NOTIFY names.

The listener knows the state only through what :class:`PostgresState` hands it when it is made
(:class:`ListenerHooks`): how to open and give back its connection, the channels to LISTEN on
with the callback of each, the serving workers' channels, and what to do after a reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asynclock._compat import deadline_after

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from asynclock.state.postgres._connection import Connection
    from asynclock.state.sql._handout import HintWatch

__all__ = ["Listener", "ListenerHooks"]

logger = logging.getLogger("asynclock")

_FIRST_RECONNECT_DELAY = 0.01
_MAX_RECONNECT_DELAY = 1.0


@dataclass(frozen=True, slots=True)
class ListenerHooks:
    """What a :class:`Listener` needs of its state."""

    #: opens the LISTEN connection (a direct or session-mode one)
    connect: Callable[[], Awaitable[Connection]]
    #: gives the connection back (closes it, or returns it to the user's pool)
    release: Callable[[Connection], Awaitable[None]]
    #: the state's own channels, each with the callback that gets a NOTIFY's payload
    channels: Mapping[str, Callable[[str], None]]
    #: the wake-ups of the state's serving workers, by the channel each hears on (the state
    #: adds and removes them; the listener only reads)
    worker_watches: Mapping[str, HintWatch]
    #: whether anything is watched (else a dropped connection is not reopened)
    watched: Callable[[], bool]
    #: wakes every watcher: after a reconnect, what was sent meanwhile went unheard
    wake_all: Callable[[], None]
    #: the state's ``op_timeout``: bounds each reconnect and each UNLISTEN
    op_timeout: float


class Listener:
    """One LISTENing connection per state; wakes the watchers of the key a NOTIFY names.

    If the connection drops, it reconnects in the background (while anything is watched), and
    once it LISTENs again every watcher is woken (a release may have gone unheard meanwhile).
    """

    def __init__(self, hooks: ListenerHooks) -> None:
        self._hooks = hooks
        self._conn: Connection | None = None
        #: the worker channels LISTENed on by the connection
        self._heard: set[str] = set()
        self._connecting = asyncio.Lock()
        self._reconnect: asyncio.Task[None] | None = None
        self._closed = False
        # one callback per channel, kept: remove_listener needs the same object
        self._callbacks = {
            channel: _on_payload(callback) for channel, callback in hooks.channels.items()
        }

    async def ensure(self) -> None:
        """Connected and LISTENing (the subscription is active when this returns)."""
        if self._conn is not None:
            return
        async with self._connecting:
            if self._conn is not None or self._closed:
                return
            conn = await self._hooks.connect()
            try:
                conn.add_termination_listener(self._on_terminated)
                for channel, callback in self._callbacks.items():
                    await conn.add_listener(channel, callback)
                for channel in tuple(self._hooks.worker_watches):
                    await conn.add_listener(channel, self._on_wake)
                    self._heard.add(channel)
            except BaseException:
                conn.terminate()
                raise
            self._adopt(conn)

    def _adopt(self, conn: Connection) -> None:
        """Keep the new LISTEN connection, unless :meth:`aclose` ran while it was opened."""
        if self._closed:
            conn.terminate()  # nobody would ever close it
        else:
            self._conn = conn

    def _on_wake(self, conn: object, pid: object, channel: object, payload: object) -> None:
        watch = self._hooks.worker_watches.get(str(channel))
        if watch is not None:
            try:
                hint: bytes | None = bytes.fromhex(str(payload))
            except ValueError:
                hint = None
            watch.wake(hint)

    async def listen(self) -> None:
        """LISTEN on the state's worker channels not heard yet (a new worker's)."""
        conn = self._conn
        if conn is None:
            return  # the reconnect LISTENs on all of them
        for channel in tuple(self._hooks.worker_watches):
            if channel not in self._heard:
                await conn.add_listener(channel, self._on_wake)
                self._heard.add(channel)

    async def unlisten(self, channel: str) -> None:
        """Stop hearing ``channel`` (its worker stopped)."""
        if channel not in self._heard:
            return
        self._heard.discard(channel)
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(Exception):  # the worker is gone either way
                async with deadline_after(self._hooks.op_timeout):
                    await conn.remove_listener(channel, self._on_wake)

    def _on_terminated(self, conn: object) -> None:
        if conn is not self._conn or self._closed:
            return
        self._conn = None
        self._heard.clear()
        # A release may have gone unheard: every watcher re-checks its key, but only once the
        # listener LISTENs again (the reconnect loop wakes them). Woken now, they would retry
        # when the state's other connections were most likely cut too (a restart, the
        # application's sessions terminated): on a pooled connection whose termination is
        # half-read (asyncpg: "cannot switch to state 12; another operation (2) is in
        # progress"), or against a server that is down, and fail a blocking acquire with
        # StateUnavailableError; and a release before the new LISTEN would still go unheard.
        if self._reconnect is None:
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = _FIRST_RECONNECT_DELAY
        hooks = self._hooks
        try:
            while not self._closed and hooks.watched() and self._conn is None:
                try:
                    async with deadline_after(hooks.op_timeout):
                        await self.ensure()
                except Exception as exc:  # noqa: BLE001, PERF203 - retried with back-off
                    logger.debug("asynclock: PostgreSQL listener reconnect failed: %r", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, _MAX_RECONNECT_DELAY)
                else:
                    hooks.wake_all()  # releases and accepts during the gap were not heard
        finally:
            self._reconnect = None

    async def aclose(self) -> None:
        """Stop reconnecting and give the connection back."""
        self._closed = True
        task, self._reconnect = self._reconnect, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                async with deadline_after(1.0):
                    await self._hooks.release(conn)
            except Exception:  # noqa: BLE001 - closing anyway
                conn.terminate()


def _on_payload(
    callback: Callable[[str], None],
) -> Callable[[object, object, object, object], None]:
    """asyncpg's listener callback ``(conn, pid, channel, payload)`` for ``callback(payload)``."""

    def heard(conn: object, pid: object, channel: object, payload: object) -> None:
        callback(str(payload))

    return heard
