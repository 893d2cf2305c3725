"""The chat-sdk queue on the same Redis: the peer of the ``inbox`` scenario (#12).

chat-sdk (the Python port of Vercel's Chat SDK) has no "store now, handle elsewhere" path. Every
message goes through ``Chat.handle_incoming_message``, which with ``concurrency="queue"``:

1. marks the message seen (``SET NX PX``, dedupe);
2. tries the thread's lock (``SET NX PX``). Won: runs the handlers in the caller, then drains
   the thread's queue (``LPOP`` until it answers nothing, an ``EVAL`` extend before and after
   each handler call, which gets the newest entry with the older ones in
   ``context.skipped``), then releases the lock (``EVAL``). An entry pushed after the last
   empty ``LPOP`` and before the release is left with no holder: *stranded*
   (vercel/chat#928);
3. lost: reads the queue's depth (``LLEN``) and enqueues (``EVAL``: RPUSH, LTRIM to
   ``max_queue_size`` dropping the oldest, PEXPIRE) and returns.

Its counterparts of the asynclock figures, same server, same process, same keys:

* **enqueue throughput**: serial ``handle_incoming_message`` on threads whose lock this
  benchmark holds, so every call takes path 3 (a message stored for a later handler, as
  ``accept`` stores one); and ``RedisStateAdapter.enqueue`` alone (its one script, no dedupe).
* **message -> handler start**: serial ``handle_incoming_message`` on an idle thread (the
  handler starts in the caller after steps 1-2), idle and under the same offered load as
  asynclock's (:func:`offered_load`: ``LOAD_RATE`` messages per second to 10 other threads).
* **burst**: every message over the keys at once, or arriving evenly over a second; afterwards
  every call has returned and no lock is held, so what is still queued is stranded, and what is
  neither handled, in a ``context.skipped``, nor stranded was trimmed away (dropped). During the
  burst, every ``release_lock`` is followed by a look (``LLEN`` + ``EXISTS`` in one
  transaction, not counted as the peer's round trips) at whether entries sit in the thread's
  queue while nobody holds its lock: each such release strands them until a later message of
  the thread happens to arrive (they are counted when the look sees them; one that a new holder
  drains first is missed, so the count is a lower bound).
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness.dispatching import ADAPTER, POOL, SendCounter

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from types import TracebackType

    from typing_extensions import Self

    from benchmarks.harness.env import Config

#: chat-sdk's default queue bound (``ConcurrencyConfig.max_queue_size``)
DEFAULT_QUEUE = 10
#: seconds a benchmark holds a thread's lock (longer than any measurement)
HOLD_MS = 600_000
#: events per second of the load under which both sides' latency is measured
LOAD_RATE = 1000


@dataclass(frozen=True)
class Burst:
    """One burst of ``n`` messages: what happened to them and what it cost."""

    n: int
    seconds: float
    #: handler calls (chat-sdk: one per drain batch; asynclock: one per event)
    handled: int
    #: folded into a handler call's ``context.skipped`` (chat-sdk only)
    skipped: int
    #: left in a queue with no holder once every call returned
    stranded: int
    #: neither handled, skipped nor queued: trimmed by the queue bound (or expired)
    dropped: int
    #: client round trips per message, the drain included
    trips: float
    #: chat-sdk: releases that left entries in the queue with no holder (a lower bound)
    stranding_releases: int = 0
    #: chat-sdk: the entries those releases left behind
    left_behind: int = 0

    @property
    def rate(self) -> float:
        """Messages per second that reached a handler (handled or skipped)."""
        return (self.handled + self.skipped) / self.seconds


class ChatQueue:
    """A chat-sdk ``Chat(concurrency="queue")`` over ``RedisStateAdapter`` on the bench server.

    Its own client with a pool bounded like asynclock's (``RedisStateAdapter(url=...)`` would
    build an unbounded one); keys under ``cfg.key("inbox", "chat-sdk", tag)``.
    """

    def __init__(self, sdk: Any, cfg: Config, tag: str, *, max_queue_size: int) -> None:
        self.sdk = sdk
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            cfg.url, max_connections=POOL, decode_responses=True
        )
        self.client = redis.asyncio.Redis(connection_pool=pool)
        self.prefix = cfg.key("inbox", "chat-sdk", tag)
        self.state = sdk.RedisStateAdapter(client=self.client, key_prefix=self.prefix)
        self.adapter = sdk.MockAdapter(ADAPTER)
        concurrency = sdk.ConcurrencyConfig(strategy="queue", max_queue_size=max_queue_size)
        config = sdk.ChatConfig(
            adapters={ADAPTER: self.adapter},
            state=self.state,
            user_name="bot",
            concurrency=concurrency,
            logger="silent",
        )
        self.chat = sdk.Chat(config)
        self.chat.on_mention(self._on_mention)
        self.handled = 0
        self.skipped = 0
        self.stranding_releases = 0
        self.left_behind = 0
        self.looks = 0
        #: message id -> perf_counter() when its handler call started
        self.started: dict[str, float] = {}

    async def __aenter__(self) -> Self:
        await self.state.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.state.disconnect()
        await self.client.aclose()

    async def _on_mention(self, thread: Any, message: Any, context: Any = None) -> None:
        self.started[message.id] = time.perf_counter()
        self.handled += 1
        self.skipped += len(getattr(context, "skipped", None) or ())
        await asyncio.sleep(0)  # the same handler as asynclock's side: count, yield once

    @staticmethod
    def thread(key: str) -> str:
        return f"{ADAPTER}:C:{key}"

    def message(self, key: str, message_id: str) -> Any:
        return self.sdk.create_test_message(
            message_id, "@bot hi", thread_id=self.thread(key), is_mention=True
        )

    def messages(self, n: int, keys: list[str], tag: str) -> list[tuple[str, Any]]:
        """``n`` messages ``<tag>-<i>`` round-robin over ``keys``, each with its key."""
        return [
            (keys[i % len(keys)], self.message(keys[i % len(keys)], f"{tag}-{i}")) for i in range(n)
        ]

    async def send(self, key: str, message: Any) -> None:
        await self.chat.handle_incoming_message(self.adapter, self.thread(key), message)

    def watch_releases(self) -> None:
        """After every ``release_lock``, look whether it left entries with no holder."""
        release = self.state.release_lock

        async def release_and_look(lock: Any) -> None:
            await release(lock)
            thread = lock.thread_id
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.llen(f"{self.prefix}:queue:{thread}")
                pipe.exists(f"{self.prefix}:lock:{thread}")
                depth, held = await pipe.execute()
            self.looks += 1
            if depth and not held:
                self.stranding_releases += 1
                self.left_behind += depth

        self.state.release_lock = release_and_look

    async def hold(self, keys: list[str]) -> None:
        """Take the lock of every thread of ``keys``: each message to them is enqueued."""
        for key in keys:
            if await self.state.acquire_lock(self.thread(key), HOLD_MS) is None:
                raise RuntimeError(f"chat-sdk: the lock of {self.thread(key)!r} is taken")

    async def queued(self, keys: list[str]) -> int:
        """Entries in the queues of ``keys`` (the adapter's own LLEN)."""
        return sum([await self.state.queue_depth(self.thread(key)) for key in keys])


async def enqueue_rate(
    sdk: Any, cfg: Config, n: int, keys: list[str], tag: str
) -> tuple[float, float]:
    """(messages per second, round trips per message) of serial ``handle_incoming_message``
    calls that each enqueue (every thread is held; the queue bound is ``n``: nothing trimmed)."""
    async with ChatQueue(sdk, cfg, tag, max_queue_size=n) as peer:
        await peer.hold(keys)
        messages = peer.messages(n, keys, tag)
        await peer.send(keys[0], peer.message(keys[0], f"{tag}-warm"))
        sends = SendCounter()
        t0 = time.perf_counter()
        with sends.counting():
            for key, message in messages:
                await peer.send(key, message)
        elapsed = time.perf_counter() - t0
        if peer.handled or await peer.queued(keys) != n + 1:
            raise RuntimeError("chat-sdk: not every message took the enqueue path")
    return n / elapsed, sends.sends / n


async def adapter_enqueue_rate(sdk: Any, cfg: Config, n: int, keys: list[str], tag: str) -> float:
    """Entries per second of serial ``RedisStateAdapter.enqueue`` calls (one EVAL each)."""
    async with ChatQueue(sdk, cfg, tag, max_queue_size=n) as peer:
        now = int(time.time() * 1000)
        entries = [
            (peer.thread(key), sdk.QueueEntry(message=m, enqueued_at=now, expires_at=now + 90_000))
            for key, m in peer.messages(n, keys, tag)
        ]
        t0 = time.perf_counter()
        for thread, entry in entries:
            await peer.state.enqueue(thread, entry, n)
        elapsed = time.perf_counter() - t0
    return n / elapsed


async def latency(sdk: Any, cfg: Config, n: int, *, loaded: bool) -> list[float]:
    """Seconds from calling ``handle_incoming_message`` on an idle thread until its handler
    starts, one message at a time; ``loaded``: a producer sends to 10 other threads meanwhile."""
    tag = "loaded" if loaded else "idle"
    async with ChatQueue(sdk, cfg, tag, max_queue_size=DEFAULT_QUEUE) as peer:
        stop = asyncio.Event()

        async def send(i: int) -> None:
            key = f"L{i % 10}"
            await peer.send(key, peer.message(key, f"load-{i}"))

        load = asyncio.create_task(offered_load(send, stop)) if loaded else None
        await asyncio.sleep(0.2)  # the producer is running
        samples = []
        for i in range(n):
            message = peer.message("probe", f"p-{i}")
            t0 = time.perf_counter()
            await peer.send("probe", message)
            samples.append(peer.started[message.id] - t0)
        stop.set()
        if load is not None:
            await load
    return samples


async def arriving(calls: list[Callable[[], Awaitable[object]]], spread: float) -> None:
    """Start ``calls`` evenly over ``spread`` seconds (0: all at once); wait for all of them."""

    async def at(offset: float, call: Callable[[], Awaitable[object]]) -> None:
        if offset:
            await asyncio.sleep(offset)  # the workload's arrival schedule
        await call()

    n = len(calls)
    await asyncio.gather(*(at(spread * i / n, call) for i, call in enumerate(calls)))


async def offered_load(send: Callable[[int], Awaitable[object]], stop: asyncio.Event) -> int:
    """Call ``send(0)``, ``send(1)``, ... ``LOAD_RATE`` times a second, each in a task of its own
    (a slow call does not slow the load down), until ``stop``; wait for them; how many."""
    tasks: set[asyncio.Task[object]] = set()
    start = time.perf_counter()
    i = 0
    while not stop.is_set():
        # the load's schedule; at least one pass of the loop per call, even when behind it
        await asyncio.sleep(max(start + i / LOAD_RATE - time.perf_counter(), 0.0))
        task: asyncio.Task[object] = asyncio.ensure_future(send(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
    await asyncio.gather(*tasks)
    return i


async def burst(
    sdk: Any,
    cfg: Config,
    n: int,
    keys: list[str],
    tag: str,
    *,
    max_queue_size: int,
    spread: float,
) -> Burst:
    """``n`` messages over ``keys``, the ``handle_incoming_message`` calls started evenly over
    ``spread`` seconds (0: all at once)."""
    async with ChatQueue(sdk, cfg, tag, max_queue_size=max_queue_size) as peer:
        messages = peer.messages(n, keys, tag)
        peer.watch_releases()
        sends = SendCounter()
        with sends.counting():
            t0 = time.perf_counter()
            await arriving([functools.partial(peer.send, k, m) for k, m in messages], spread)
            elapsed = time.perf_counter() - t0
        # every call returned, so every holder released: what is queued now has no holder
        stranded = await peer.queued(keys)
        handled, skipped = peer.handled, peer.skipped
        trips = (sends.sends - peer.looks) / n  # the looks are this benchmark's, not chat-sdk's
        found = (peer.stranding_releases, peer.left_behind)
    dropped = n - handled - skipped - stranded
    return Burst(n, elapsed, handled, skipped, stranded, dropped, trips, *found)
