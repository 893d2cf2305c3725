"""Multi-process contention for the ``sql`` scenario: N spawned processes x M tasks on one key.

Like ``_procs`` (the Redis rows of ``contended``), but each child opens an asynclock state of
any backend (``postgres``, ``mysql`` or ``redis``) from its URL. The children run the shared
workload (``_contend.contend``), send back their timestamped cycles, and the parent merges them
(perf_counter is CLOCK_MONOTONIC: one clock for the whole machine).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks._contend import Event, Outcome, contend
from benchmarks._env import require_asynclock

if TYPE_CHECKING:
    from multiprocessing.synchronize import Event as MpEvent

    from benchmarks._env import Asynclock

#: state class of each backend, by the name ``asynclock`` exports it under
STATE_CLASSES = {"postgres": "PostgresState", "mysql": "MySQLState", "redis": "RedisState"}


def open_state(api: Asynclock, backend: str, url: str, prefix: str, **options: Any) -> Any:
    """``<Backend>State.from_url(url, prefix=prefix, **options)``: as a user builds it."""
    return getattr(api.module, STATE_CLASSES[backend]).from_url(url, prefix=prefix, **options)


async def warm_state(state: Any, key: str) -> None:
    """Open the state's connections, schema and (PostgreSQL) LISTEN connection before timing.

    ``watch()`` is the State protocol's wake-up subscription; PostgresState connects its
    listener on the first one, which would otherwise land in the first timed cross-process wait.
    """
    async with state.watch(key):
        pass


class LockContender:
    """A new ``AsyncLock(state, key, ttl=30.0)`` per cycle: ``acquire()`` then ``release()``."""

    def __init__(self, lock_cls: Any, state: Any, key: str) -> None:
        self.lock_cls, self.state, self.key = lock_cls, state, key

    async def acquire(self) -> Any:
        lock = self.lock_cls(self.state, self.key, ttl=30.0)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


@dataclass(frozen=True)
class ChildArgs:
    backend: str
    url: str
    prefix: str
    key: str
    index: int
    tasks: int
    cycles: int
    timeout: float


async def _child(args: ChildArgs, out: Any, start: MpEvent, close: MpEvent) -> None:
    api = require_asynclock()
    state = open_state(api, args.backend, args.url, args.prefix)
    lock_cls = api.lock_factory()
    try:
        warm_key = f"{args.key}:warm:{args.index}"
        await warm_state(state, warm_key)
        warm = await contend(
            LockContender(lock_cls, state, warm_key), workers=args.tasks, cycles=3, timeout=30
        )
        if warm.timed_out:
            raise RuntimeError("warm-up timed out")
        out.put(("ready", args.index))

        def wait_for_start() -> float:
            # Blocks the loop on purpose: every task is parked, nothing else should run.
            if not start.wait(args.timeout):
                raise RuntimeError("no start signal")
            return time.perf_counter()

        result = await contend(
            LockContender(lock_cls, state, args.key),
            workers=args.tasks,
            cycles=args.cycles,
            group=args.index,
            first_worker=args.index * args.tasks,
            timeout=args.timeout,
            start=wait_for_start,
        )
        out.put(("done", args.index, result.events, result.counter_violations, result.timed_out))
        close.wait(args.timeout)
    finally:
        await state.aclose()


def child_main(args: ChildArgs, out: Any, start: MpEvent, close: MpEvent) -> None:
    """Entry point of a spawned child."""
    try:
        asyncio.run(_child(args, out, start, close))
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", args.index, traceback.format_exc(limit=5)))


def _collect(
    out: Any, procs: list[Any], kind: str, count: int, deadline: float
) -> list[tuple[Any, ...]]:
    got: list[tuple[Any, ...]] = []
    while len(got) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RuntimeError(f"timed out waiting for {count - len(got)} '{kind}' message(s)")
        try:
            msg = out.get(timeout=min(0.5, remaining))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a child died with exit code {dead[0]}") from None
            continue
        if msg[0] == "error":
            raise RuntimeError(f"child {msg[1]} failed:\n{msg[2]}")
        if msg[0] == kind:
            got.append(msg)
    return got


def run_processes(
    *,
    backend: str,
    url: str,
    prefix: str,
    key: str,
    processes: int,
    tasks: int,
    cycles: int,
    timeout: float,
) -> tuple[Outcome | None, str | None]:
    """Spawn ``processes`` children, start them together on one signal, merge their cycles.

    Blocking on purpose: the parent has nothing else to run meanwhile.
    """
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start, close = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(
            target=child_main,
            args=(
                ChildArgs(backend, url, prefix, key, i, tasks, cycles, timeout),
                out,
                start,
                close,
            ),
            daemon=True,
        )
        for i in range(processes)
    ]
    for proc in procs:
        proc.start()
    try:
        _collect(out, procs, "ready", processes, time.monotonic() + 90)
        started = time.perf_counter()
        start.set()
        done = _collect(out, procs, "done", processes, time.monotonic() + timeout + 30)
    except RuntimeError as exc:
        return None, str(exc)
    finally:
        close.set()
        for proc in procs:
            proc.join(15)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()  # only our own children, by object
                proc.join(5)
    events: list[Event] = [ev for msg in done for ev in msg[2]]
    violations = sum(int(msg[3]) for msg in done)
    timed_out = any(bool(msg[4]) for msg in done)
    return Outcome(events, violations, started, timed_out), None
