"""The worker processes and producers of the ``inbox-scale`` scenario (#24).

Three kinds of *series* run the same workload:

* **asynclock** on Redis, Redis Cluster, PostgreSQL and MariaDB: each worker process runs
  ``EventDispatcher.serve()``, the producer calls ``EventDispatcher.accept`` (public API only);
* **procrastinate** on PostgreSQL, a task deferred with ``lock=`` the thread key (per-key order
  across workers, its own LISTEN/NOTIFY and ``FOR UPDATE SKIP LOCKED`` fetch), one job at a time
  per worker process (its default concurrency);
* **a Redis Streams consumer group**, the floor of "each entry reaches one consumer" with no
  per-key order: ``XADD``, then ``XREADGROUP COUNT 1`` and ``XACK`` by each worker.

Each worker process is a child of ``_spawn.Children``: it opens its side, reports ``ready``,
waits for ``go``, works until ``stop``, and reports every handling as it happens
(``("handled", index, message id, key, attempt, perf_counter)``; perf_counter is
CLOCK_MONOTONIC, one clock for the whole machine). The parent's side of a cell is here too: the
:class:`Collector` of those reports and the producer's schedule (:func:`send_all`). How server
work is counted is ``_inbox_scale_count.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import queue
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness.env import require_asynclock
from benchmarks.scenarios import _inbox_scale_count as count

if TYPE_CHECKING:
    from collections.abc import Callable
    from multiprocessing.synchronize import Event as MpEvent

    from benchmarks.harness.spawn import Children

#: the asynclock series (a state URL each) and the two peers
ASYNCLOCK_SERIES = ("redis", "redis-cluster", "postgres", "mysql")
PROCRASTINATE, STREAMS = "procrastinate", "streams"
#: the connections of one worker's pool on a SQL server (procrastinate's too)
WORKER_CONNECTIONS = 3
#: the procrastinate task every worker runs
TASK = "inbox_scale_handle"
#: seconds a child waits for the parent's next signal before it gives up
SIGNAL_WAIT = 300.0


@dataclass(frozen=True)
class Side:
    """What one series runs on: ``series``, its server URL and this cell's namespace."""

    series: str
    url: str
    namespace: str

    @property
    def stream(self) -> str:
        return f"{self.namespace}:stream"

    @property
    def pool(self) -> dict[str, int]:
        """The connection bound of a worker's state: on the SQL servers, whose connection slots
        (100 on PostgreSQL) the whole machine shares, 16 workers stay within
        ``WORKER_CONNECTIONS`` each (their LISTEN connection aside)."""
        return (
            {"max_connections": WORKER_CONNECTIONS} if self.series in ("postgres", "mysql") else {}
        )

    @property
    def queue(self) -> str:
        """procrastinate's queue of the cell (short: it is part of a NOTIFY channel's name)."""
        return "scale-" + hashlib.sha1(self.namespace.encode()).hexdigest()[:16]


# -- the worker process ------------------------------------------------------------------------


def worker_main(side: Side, index: int, go: MpEvent, stop: MpEvent, out: Any) -> None:
    """Entry point of a spawned worker process."""
    try:
        asyncio.run(_worker(side, index, go, stop, out))
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", index, traceback.format_exc(limit=8)))


async def _worker(side: Side, index: int, go: MpEvent, stop: MpEvent, out: Any) -> None:
    if side.series == "mysql":
        count.count_mysql_statements()

    def handled(message_id: str, key: str, attempt: int) -> None:
        out.put(("handled", index, message_id, key, attempt, time.perf_counter()))

    if side.series in ASYNCLOCK_SERIES:
        run, close = await _asynclock_worker(side, handled)
    elif side.series == PROCRASTINATE:
        run, close = await _procrastinate_worker(side, index, handled)
    else:
        run, close = await _streams_worker(side, index, handled)
    try:
        out.put(("ready", index))
        if not await asyncio.to_thread(go.wait, SIGNAL_WAIT):
            raise RuntimeError("no go signal")
        working = asyncio.ensure_future(run())
        stopping = asyncio.ensure_future(asyncio.to_thread(stop.wait, SIGNAL_WAIT))
        await asyncio.wait({working, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if working.done():
            working.result()  # it failed: the traceback goes to the parent
            raise RuntimeError("the worker stopped by itself")
        await stopping
        await close(working)
    finally:
        out.put(("done", index, list(count.STAMPS)))


async def _asynclock_worker(side: Side, handled: Any) -> tuple[Any, Any]:
    api = require_asynclock().module
    state = api.state_from_url(side.url, prefix=f"{side.namespace}:", **side.pool)
    bot = api.EventDispatcher(state, on_lock_conflict="queue", lock_ttl=30.0, max_pending=10**6)

    async def handle(event: Any, ctx: Any) -> None:
        handled(event.message_id, event.thread_id, ctx.attempt)

    bot.add_handler("*", handle)

    async def close(serving: asyncio.Future[None]) -> None:
        await bot.aclose()  # serve() finishes the entry in hand and returns
        await serving
        await state.aclose()

    return bot.serve, close


async def _procrastinate_worker(side: Side, index: int, handled: Any) -> tuple[Any, Any]:
    import procrastinate

    connector = procrastinate.PsycopgConnector(
        conninfo=side.url, min_size=1, max_size=WORKER_CONNECTIONS
    )
    app = procrastinate.App(connector=connector)

    @app.task(name=TASK, pass_context=True)
    async def handle(context: Any, message_id: str, key: str) -> None:
        handled(message_id, key, context.job.attempts + 1)

    await app.open_async()

    def run() -> Any:
        return app.run_worker_async(
            queues=[side.queue],
            name=f"w{index}",
            install_signal_handlers=False,
            delete_jobs="never",
        )

    async def close(working: asyncio.Future[None]) -> None:
        working.cancel()  # procrastinate's graceful stop: the job in hand finishes
        with contextlib.suppress(asyncio.CancelledError):
            await working
        await app.close_async()

    return run, close


async def _streams_worker(side: Side, index: int, handled: Any) -> tuple[Any, Any]:
    client = redis.asyncio.Redis.from_url(side.url)
    stopping = asyncio.Event()

    async def run() -> None:
        while not stopping.is_set():
            reply = await client.xreadgroup(
                "workers", f"c{index}", {side.stream: ">"}, count=1, block=1000
            )
            for _, entries in reply or ():
                for entry_id, fields in entries:
                    handled(fields[b"m"].decode(), fields[b"k"].decode(), 1)
                    await client.xack(side.stream, "workers", entry_id)

    async def close(working: asyncio.Future[None]) -> None:
        stopping.set()  # the blocking read ends within its second
        await working
        await client.aclose()

    return run, close


# -- producers (in the parent process) ------------------------------------------------------------


class Producer:
    """Sends one event of ``key`` (``send``) as the series' webhook would."""

    def __init__(self, side: Side) -> None:
        self.side = side
        self._close: list[Any] = []
        self._send: Any = None

    async def open(self) -> Producer:
        side = self.side
        if side.series in ASYNCLOCK_SERIES:
            api = require_asynclock().module
            state = api.state_from_url(side.url, prefix=f"{side.namespace}:")
            bot = api.EventDispatcher(state, on_lock_conflict="queue", max_pending=10**6)
            event = api.Event

            async def accept(key: str, message_id: str) -> None:
                await bot.accept(event("message", "bench", "C", key, message_id))

            self._send, self._close = accept, [state.aclose]
        elif side.series == PROCRASTINATE:
            import procrastinate

            app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=side.url))
            await app.open_async()

            async def defer(key: str, message_id: str) -> None:
                task = app.configure_task(TASK, lock=key, queue=side.queue)
                await task.defer_async(message_id=message_id, key=key)

            self._send, self._close = defer, [app.close_async]
        else:
            client = redis.asyncio.Redis.from_url(side.url)

            async def xadd(key: str, message_id: str) -> None:
                await client.xadd(side.stream, {"m": message_id, "k": key})

            self._send, self._close = xadd, [client.aclose]
        return self

    async def send(self, key: str, message_id: str) -> None:
        await self._send(key, message_id)

    async def aclose(self) -> None:
        for close in self._close:
            await close()


def producer_main(
    side: Side, index: int, keys: list[str], sends: int, go: MpEvent, out: Any
) -> None:
    """A producer process (the concurrent-accepts measurement): ``sends`` events over ``keys``,
    one after the other as fast as they go; reports ``("accepted", index, start, end)``."""

    async def produce() -> None:
        producer = await Producer(side).open()
        try:
            await producer.send(f"warm-p{index}", f"warm-p{index}")
            out.put(("ready", index))
            if not await asyncio.to_thread(go.wait, SIGNAL_WAIT):
                raise RuntimeError("no go signal")
            start = time.perf_counter()
            for n in range(sends):
                await producer.send(keys[n % len(keys)], f"p{index}-{n}")
            out.put(("accepted", index, start, time.perf_counter()))
        finally:
            await producer.aclose()

    try:
        asyncio.run(produce())
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", index, traceback.format_exc(limit=8)))


# -- the parent's side of a cell: the children's reports, the producer's schedule -----------------

#: accepts in flight at once while a backlog is stored
IN_FLIGHT = 50


@dataclass
class Window:
    """A measured window on both clocks (perf_counter for handlings, time.time for MONITOR)."""

    mono: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)

    def mark(self) -> None:
        self.mono.append(time.perf_counter())
        self.wall.append(time.time())


class Collector:
    """Reads the children's queue in a thread and hands every message to the event loop."""

    def __init__(self, children: Children) -> None:
        self.children = children
        self.loop = asyncio.get_running_loop()
        self.changed = asyncio.Event()
        self.ready = 0
        self.stamps: list[list[float]] = []
        self.handled: dict[str, list[tuple[float, int, str]]] = {}  # id -> (t, attempt, key)
        self.error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.children.out.get(timeout=0.2)
            except queue.Empty:
                continue
            self.loop.call_soon_threadsafe(self._on, msg)

    def _on(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "handled":
            _, _, message, key, attempt, at = msg
            self.handled.setdefault(message, []).append((at, attempt, key))
        elif kind == "ready":
            self.ready += 1
        elif kind == "done":
            self.stamps.append(msg[2])
        elif kind == "error":
            self.error = self.error or f"child {msg[1]} failed:\n{msg[2]}"
        self.changed.set()

    async def until(self, done: Callable[[], bool], within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while not done():
            if self.error:
                raise RuntimeError(self.error)
            dead = [p.exitcode for p in self.children.procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a worker died with exit code {dead[0]} ({what})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"not within {within:.0f} s: {what}")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.5))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


async def send_all(
    producer: Producer,
    ids: list[tuple[str, str]],
    accepted: dict[str, float],
    rate: float | None,
) -> None:
    """Send ``ids`` ((key, message id), in order): on a schedule of ``rate`` per second, each in
    a task of its own, or (``None``) ``IN_FLIGHT`` at a time; a key's next waits for its last."""
    previous: dict[str, asyncio.Future[None]] = {}
    gate = asyncio.Semaphore(IN_FLIGHT if rate is None else len(ids) + 1)

    async def send(before: asyncio.Future[None] | None, key: str, message: str) -> None:
        if before is not None:
            await before
        async with gate:
            accepted[message] = time.perf_counter()
            await producer.send(key, message)

    start = time.perf_counter()
    tasks = []
    for i, (key, message) in enumerate(ids):
        if rate is not None:
            # the workload's arrival schedule; at least one pass of the loop per event
            await asyncio.sleep(max(start + i / rate - time.perf_counter(), 0.0))
        task = asyncio.ensure_future(send(previous.get(key), key, message))
        previous[key] = task
        tasks.append(task)
    await asyncio.gather(*tasks)
