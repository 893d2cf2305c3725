"""One pub/sub connection per RedisState, shared by every waiter of every key.

Waiters subscribe to their key's release channel *before* their acquire attempt and wait for
the server's confirmation, so a release between a failed attempt and the wait is never missed
(Redisson's lost wake-up, redisson#1763). A lost message (dropped connection, failover) only
delays a waiter until the holder's TTL runs out, because every wait is bounded by it.

A lost connection is re-established by the reader itself (backing off while the server is
down), every watched channel is subscribed again, and once the server confirmed, every waiter
is woken to retry: a release it missed meanwhile costs it nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

from asynclock._compat import deadline_after

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.connection import AbstractConnection

    from asynclock.state._watch import EventWatch

logger = logging.getLogger("asynclock")

# A channel stays subscribed this long after its last waiter left: a key under steady
# contention would otherwise pay a SUBSCRIBE round trip for every new waiter.
_LINGER = 1.0
_FIRST_RECONNECT_DELAY = 0.01
_MAX_RECONNECT_DELAY = 1.0


class Subscriber:
    """Per-key release channels multiplexed on one dedicated connection."""

    def __init__(self, client: Redis, op_timeout: float) -> None:
        self._client = client
        self._op_timeout = op_timeout
        self._conn: AbstractConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._watches: dict[bytes, set[EventWatch]] = {}
        self._lingering: dict[bytes, asyncio.TimerHandle] = {}
        # one future per SUBSCRIBE sent, resolved in order by the server's confirmations
        self._confirmations: dict[bytes, deque[asyncio.Future[None]]] = {}
        self._closed = False

    def _new_connection(self) -> AbstractConnection:
        pool = self._client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        # a subscriber blocks on reads by design, and speaks RESP2 pub/sub arrays
        kwargs["socket_timeout"] = None
        kwargs["protocol"] = 2
        conn: AbstractConnection = pool.connection_class(**kwargs)
        return conn

    async def _ensure_connected(self) -> AbstractConnection:
        if self._conn is not None:
            return self._conn
        async with self._connecting:
            if self._conn is None:
                conn = self._new_connection()
                async with deadline_after(self._op_timeout):
                    await conn.connect()  # type: ignore[no-untyped-call]
                self._conn = conn
                if self._watches:  # after a reconnect: subscribe again to what is watched
                    for channel in self._watches:
                        self._confirmations.setdefault(channel, deque()).append(
                            asyncio.get_running_loop().create_future()
                        )
                    await conn.send_command("SUBSCRIBE", *self._watches, check_health=False)
                self._reader = asyncio.get_running_loop().create_task(
                    self._read(conn), name="asynclock-redis-subscriber"
                )
            return self._conn

    async def add(self, channel: bytes, watch: EventWatch) -> None:
        """Subscribe ``watch`` to ``channel``; returns once the server confirmed."""
        if self._closed:
            raise RuntimeError("the RedisState is closed")
        conn = await self._ensure_connected()
        watches = self._watches.get(channel)
        if watches is not None:
            watches.add(watch)
            lingering = self._lingering.pop(channel, None)
            if lingering is not None:
                lingering.cancel()
            pending = self._confirmations.get(channel)
            if pending:  # someone else's SUBSCRIBE for this channel is not confirmed yet
                await asyncio.shield(pending[-1])
            return
        self._watches[channel] = {watch}
        confirmed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._confirmations.setdefault(channel, deque()).append(confirmed)
        try:
            await conn.send_command("SUBSCRIBE", channel, check_health=False)
            async with deadline_after(self._op_timeout):
                await asyncio.shield(confirmed)
        except BaseException:
            self.discard(channel, watch)
            raise

    def discard(self, channel: bytes, watch: EventWatch) -> None:
        """Unsubscribe ``watch``; the channel goes ``_LINGER`` s after its last watch left."""
        watches = self._watches.get(channel)
        if watches is None:
            return
        watches.discard(watch)
        if watches or channel in self._lingering or self._closed:
            return
        self._lingering[channel] = asyncio.get_running_loop().call_later(
            _LINGER, self._unsubscribe_idle, channel
        )

    def _unsubscribe_idle(self, channel: bytes) -> None:
        self._lingering.pop(channel, None)
        if self._watches.get(channel):
            return
        self._watches.pop(channel, None)
        conn = self._conn
        if conn is not None and not self._closed:
            task = asyncio.get_running_loop().create_task(self._unsubscribe(conn, channel))
            task.add_done_callback(_ignore_result)

    async def _unsubscribe(self, conn: AbstractConnection, channel: bytes) -> None:
        with contextlib.suppress(Exception):
            await conn.send_command("UNSUBSCRIBE", channel, check_health=False)

    async def _read(self, conn: AbstractConnection) -> None:
        try:
            while True:
                message = await conn.read_response()
                if not isinstance(message, list) or len(message) < 2:
                    continue
                kind, channel = message[0], message[1]
                if kind == b"message":
                    for watch in tuple(self._watches.get(channel, ())):
                        watch.fire()
                elif kind == b"subscribe":
                    pending = self._confirmations.get(channel)
                    if pending:
                        future = pending.popleft()
                        if not pending:
                            del self._confirmations[channel]
                        if not future.done():
                            future.set_result(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the connection: wake everyone, reconnect
            logger.warning("asynclock: Redis subscriber connection lost (%r); reconnecting", exc)
            await self._connection_lost(conn, exc)

    async def _connection_lost(self, conn: AbstractConnection, exc: Exception) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect()
        self._conn = None
        for pending in self._confirmations.values():
            for future in pending:
                if not future.done():
                    future.set_exception(ConnectionError(f"subscriber connection lost: {exc!r}"))
        self._confirmations.clear()
        # Any waiter may have missed a release while the connection was down, so every one of
        # them retries, but only once the channels are subscribed again: woken now, they would
        # retry against a server that may be down (a restart: StateUnavailableError out of a
        # blocking acquire) or, the server being up, could miss a release published before the
        # re-subscription and sleep until the holder's TTL runs out.
        delay = _FIRST_RECONNECT_DELAY
        while not self._closed and self._watches:
            await asyncio.sleep(delay)
            try:
                await self._ensure_connected()
            except Exception as retry_exc:  # noqa: BLE001 - keep trying while anyone waits
                logger.debug("asynclock: subscriber reconnect failed: %r", retry_exc)
                delay = min(delay * 2, _MAX_RECONNECT_DELAY)
                continue
            confirmations = [f for pending in self._confirmations.values() for f in pending]
            try:
                async with deadline_after(self._op_timeout):
                    await asyncio.gather(*(asyncio.shield(f) for f in confirmations))
            except Exception:  # noqa: BLE001 - lost again (its own reader takes over), or slow
                if self._conn is None:
                    return
            self._wake_all()
            return

    def _wake_all(self) -> None:
        for watches in self._watches.values():
            for watch in watches:
                watch.fire()

    async def aclose(self) -> None:
        """Stop the reader and close the connection."""
        self._closed = True
        for handle in self._lingering.values():
            handle.cancel()
        self._lingering.clear()
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.disconnect()
        self._wake_all()
        self._watches.clear()


def _ignore_result(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
