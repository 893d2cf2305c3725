"""One pub/sub connection per RedisState, shared by every waiter of every key.

Waiters subscribe to their key's release channel *before* their acquire attempt and wait for
the server's confirmation, so a release between a failed attempt and the wait is never missed
(Redisson's lost wake-up, redisson#1763). A lost message (dropped connection, failover) only
delays a waiter until the holder's TTL runs out, because every wait is bounded by it.

A lost connection is re-established by the reader itself (backing off while the server is
down), every watched channel is subscribed again, and once the server confirmed, every waiter
is woken to retry: a release it missed meanwhile costs it nothing.

On Redis Cluster (:class:`ShardedSubscriber`), release channels are *sharded* channels
(``SSUBSCRIBE``/``SPUBLISH``): a message only travels on the node that owns the channel's slot,
which is the lock key's slot since the channel shares its hash tag. There is one subscriber
connection per node that owns a watched channel, opened on demand. When a slot moves (resharding,
failover), its node refuses or drops the channel; the watches move to the new owner and are woken
once subscribed there, so a release published meanwhile costs at most one retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from asynclock._compat import deadline_after
from asynclock.state.redis._cluster import slot_of
from asynclock.state.redis._pool import pack

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from redis.asyncio.connection import AbstractConnection

    from asynclock.state._watch import EventWatch
    from asynclock.state.redis._cluster import Address, ClusterRouter

logger = logging.getLogger("asynclock")

# A channel stays subscribed this long after its last waiter left: a key under steady
# contention would otherwise pay a SUBSCRIBE round trip for every new waiter.
_LINGER = 1.0
_FIRST_RECONNECT_DELAY = 0.01
_MAX_RECONNECT_DELAY = 1.0


class Subscriber:
    """Per-key release channels multiplexed on one dedicated connection."""

    def __init__(
        self,
        new_connection: Callable[[], AbstractConnection],
        op_timeout: float,
        *,
        sharded: bool = False,
        on_moved: Callable[[bytes, set[EventWatch]], None] | None = None,
        locate: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``new_connection`` makes the (unconnected) pub/sub connection, RESP2, no read timeout.

        ``sharded``: use ``SSUBSCRIBE`` (Redis Cluster's sharded pub/sub; every channel must be
        served by this connection's node). When the node answers ``MOVED`` for a channel, or
        drops a channel because its slot migrated away, the channel's watches are taken off this
        subscriber and handed to ``on_moved`` to subscribe again elsewhere.

        ``locate``: awaited before every (re)connection, within its deadline (Redis Sentinel:
        ask the sentinels where the master is now, so a reconnect follows a failover).
        """
        self._new_connection = new_connection
        self._op_timeout = op_timeout
        self._sharded = sharded
        self._on_moved = on_moved
        self._locate = locate
        if sharded:
            self._subscribe, self._unsubscribe_command = b"SSUBSCRIBE", b"SUNSUBSCRIBE"
            self._message, self._confirm, self._dropped = (
                b"smessage",
                b"ssubscribe",
                b"sunsubscribe",
            )
        else:
            self._subscribe, self._unsubscribe_command = b"SUBSCRIBE", b"UNSUBSCRIBE"
            self._message, self._confirm, self._dropped = b"message", b"subscribe", b"unsubscribe"
        self._conn: AbstractConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()
        self._watches: dict[bytes, set[EventWatch]] = {}
        self._lingering: dict[bytes, asyncio.TimerHandle] = {}
        # one future per SUBSCRIBE sent, resolved in order by the server's confirmations
        self._confirmations: dict[bytes, deque[asyncio.Future[None]]] = {}
        # UNSUBSCRIBEs sent and not confirmed yet, per channel (any other is the server's own)
        self._unsubscribing: dict[bytes, int] = {}
        self._closed = False

    @property
    def channels(self) -> int:
        """Channels subscribed (or lingering) right now."""
        return len(self._watches)

    async def _ensure_connected(self) -> AbstractConnection:
        if self._conn is not None:
            return self._conn
        async with self._connecting:
            if self._conn is None:
                async with deadline_after(self._op_timeout):
                    if self._locate is not None:
                        await self._locate()
                    conn = self._new_connection()
                    await conn.connect()  # type: ignore[no-untyped-call]
                self._conn = conn
                if self._watches:  # after a reconnect: subscribe again to what is watched
                    for channel in self._watches:
                        self._confirmations.setdefault(channel, deque()).append(
                            asyncio.get_running_loop().create_future()
                        )
                    # sharded channels may hash to different slots: one SSUBSCRIBE each
                    groups = [[c] for c in self._watches] if self._sharded else [[*self._watches]]
                    await conn.send_packed_command(
                        [pack((self._subscribe, *group)) for group in groups], check_health=False
                    )
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
            await conn.send_command(self._subscribe, channel, check_health=False)
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
        self._unsubscribing[channel] = self._unsubscribing.get(channel, 0) + 1
        with contextlib.suppress(Exception):
            await conn.send_command(self._unsubscribe_command, channel, check_health=False)

    async def _read(self, conn: AbstractConnection) -> None:
        try:
            while True:
                try:
                    message = await conn.read_response()
                except redis_errors.ResponseError as exc:
                    # an error reply to a (S)SUBSCRIBE: the reply was read whole, the stream is
                    # in sync. MOVED: the channel's slot lives on another node.
                    if not isinstance(exc, redis_errors.AskError) or self._on_moved is None:
                        raise
                    self._slot_moved(exc.slot_id)
                    continue
                if not isinstance(message, list) or len(message) < 2:
                    continue
                kind, channel = message[0], message[1]
                if kind == self._message:
                    payload = message[2] if len(message) > 2 else b""
                    for watch in tuple(self._watches.get(channel, ())):
                        watch.heard(payload)
                elif kind == self._confirm:
                    pending = self._confirmations.get(channel)
                    if pending:
                        future = pending.popleft()
                        if not pending:
                            del self._confirmations[channel]
                        if not future.done():
                            future.set_result(None)
                elif kind == self._dropped:
                    count = self._unsubscribing.get(channel, 0)
                    if count > 1:
                        self._unsubscribing[channel] = count - 1
                    elif count == 1:
                        del self._unsubscribing[channel]
                    elif self._on_moved is not None:
                        # not asked for: the server dropped it (its slot migrated away)
                        self._move_away(channel)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the connection: wake everyone, reconnect
            logger.warning("asynclock: Redis subscriber connection lost (%r); reconnecting", exc)
            await self._connection_lost(conn, exc)

    def _slot_moved(self, slot: int) -> None:
        """Every channel of ``slot`` was refused here: hand its watches over to ``on_moved``."""
        for channel in [c for c in self._watches if slot_of(c) == slot]:
            self._move_away(channel)

    def _move_away(self, channel: bytes) -> None:
        watches = self._watches.pop(channel, set())
        lingering = self._lingering.pop(channel, None)
        if lingering is not None:
            lingering.cancel()
        # an add() waiting for this channel's confirmation returns: its watch is handed over
        # below, and is woken once it is subscribed again elsewhere
        for future in self._confirmations.pop(channel, ()):
            if not future.done():
                future.set_result(None)
        if watches and self._on_moved is not None:
            self._on_moved(channel, watches)

    async def _connection_lost(self, conn: AbstractConnection, exc: Exception) -> None:
        with contextlib.suppress(Exception):
            await conn.disconnect()
        self._conn = None
        self._unsubscribing.clear()
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


class ShardedSubscriber:
    """Release channels of a Redis Cluster: one sharded :class:`Subscriber` per node."""

    def __init__(self, router: ClusterRouter, op_timeout: float) -> None:
        self._router = router
        self._op_timeout = op_timeout
        self._nodes: dict[Address, Subscriber] = {}
        # the watches inside a watch() right now, per channel, whichever node serves them
        self._active: dict[bytes, set[EventWatch]] = {}
        self._moving: set[asyncio.Task[None]] = set()
        self._closed = False

    def _node(self, address: Address) -> Subscriber:
        subscriber = self._nodes.get(address)
        if subscriber is None:
            router = self._router
            subscriber = Subscriber(
                lambda: router.new_connection(address, protocol=2),
                self._op_timeout,
                sharded=True,
                on_moved=self._moved,
            )
            self._nodes[address] = subscriber
        return subscriber

    async def add(self, channel: bytes, watch: EventWatch) -> None:
        """Subscribe ``watch`` to ``channel`` on the node owning it; returns once confirmed."""
        if self._closed:
            raise RuntimeError("the RedisState is closed")
        self._active.setdefault(channel, set()).add(watch)
        try:
            address = await self._router.address_of(slot_of(channel))
            await self._node(address).add(channel, watch)
        except BaseException:
            self.discard(channel, watch)
            raise

    def discard(self, channel: bytes, watch: EventWatch) -> None:
        """Unsubscribe ``watch`` from ``channel`` (on whichever node serves it now)."""
        active = self._active.get(channel)
        if active is not None:
            active.discard(watch)
            if not active:
                del self._active[channel]
        for subscriber in self._nodes.values():
            subscriber.discard(channel, watch)

    def _moved(self, channel: bytes, watches: set[EventWatch]) -> None:
        self._router.mark_stale()
        if self._closed:
            return
        task = asyncio.get_running_loop().create_task(self._resubscribe(channel, watches))
        self._moving.add(task)
        task.add_done_callback(self._moving.discard)

    async def _resubscribe(self, channel: bytes, watches: set[EventWatch]) -> None:
        """Subscribe ``watches`` again where ``channel`` lives now, then wake them to retry."""
        try:
            for watch in watches:
                if watch not in self._active.get(channel, ()):
                    continue  # it left its watch() meanwhile
                try:
                    address = await self._router.address_of(slot_of(channel))
                    subscriber = self._node(address)
                    await subscriber.add(channel, watch)
                except Exception as exc:  # noqa: BLE001 - the waiter falls back to the TTL
                    logger.debug("asynclock: re-subscribing %r failed: %r", channel, exc)
                if watch not in self._active.get(channel, ()):
                    for subscriber in self._nodes.values():
                        subscriber.discard(channel, watch)
        finally:
            # a release may have been published while the channel moved: let every waiter retry
            for watch in watches:
                watch.fire()

    async def aclose(self) -> None:
        """Close every node's subscriber."""
        self._closed = True
        for task in list(self._moving):
            task.cancel()
        nodes, self._nodes = list(self._nodes.values()), {}
        for subscriber in nodes:
            await subscriber.aclose()
        self._active.clear()


def _ignore_result(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
