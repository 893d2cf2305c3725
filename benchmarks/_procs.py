"""The multi-process contended variant: N spawned processes x M tasks on one key.

Each child runs the same workload as the single-process rows (``_contend.contend``) and sends
back its timestamped cycles; the parent merges them (perf_counter is CLOCK_MONOTONIC, one clock
for the whole machine), checks that no two critical sections overlapped and measures the
handoffs between processes.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks._contend import Contender, Event, Outcome, contend
from benchmarks._env import require_asynclock

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from multiprocessing.synchronize import Event as MpEvent

    from benchmarks._env import CommandCounter

ASYNCLOCK = "asynclock"
REDISPY = "redis-py"


@dataclass(frozen=True)
class ChildArgs:
    url: str
    prefix: str
    variant: str
    key: str
    index: int
    tasks: int
    cycles: int
    timeout: float


class _RedisPy:
    def __init__(self, client: redis.asyncio.Redis, key: str) -> None:
        self.client, self.key = client, key

    async def acquire(self) -> Any:
        lock = self.client.lock(self.key, timeout=30)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


class _Asynclock:
    def __init__(self, lock_cls: Any, state: Any, key: str) -> None:
        self.lock_cls, self.state, self.key = lock_cls, state, key

    async def acquire(self) -> Any:
        lock = self.lock_cls(self.state, self.key, ttl=30.0)
        await lock.acquire()
        return lock

    async def release(self, handle: Any) -> None:
        await handle.release()


async def _open(
    args: ChildArgs,
) -> tuple[Callable[[str], Contender], Callable[[], Awaitable[None]]]:
    if args.variant == REDISPY:
        client = redis.asyncio.Redis.from_url(args.url)
        return (lambda key: _RedisPy(client, key)), client.aclose
    api = require_asynclock()
    state = api.redis_state(args.url, args.prefix)
    lock_cls = api.lock_factory()
    return (lambda key: _Asynclock(lock_cls, state, key)), state.aclose


async def _child(args: ChildArgs, out: Any, start: MpEvent, close: MpEvent) -> None:
    make, aclose = await _open(args)
    try:
        warm = await contend(
            make(f"{args.key}:warm:{args.index}"), workers=args.tasks, cycles=3, group=args.index
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
            make(args.key),
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
        await aclose()


def child_main(args: ChildArgs, out: Any, start: MpEvent, close: MpEvent) -> None:
    """Entry point of a spawned child."""
    try:
        asyncio.run(_child(args, out, start, close))
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", args.index, traceback.format_exc(limit=5)))


@dataclass
class ProcResult:
    outcome: Outcome | None
    commands: int
    error: str | None = None


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


async def run_processes(
    *,
    url: str,
    prefix: str,
    variant: str,
    key: str,
    processes: int,
    tasks: int,
    cycles: int,
    counter: CommandCounter,
    timeout: float = 120.0,
) -> ProcResult:
    """Spawn ``processes`` children, start them together, merge their cycles."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start, close = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(
            target=child_main,
            args=(
                ChildArgs(url, prefix, variant, key, i, tasks, cycles, timeout),
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
        # Blocking waits: the parent's loop has nothing else to do meanwhile.
        _collect(out, procs, "ready", processes, time.monotonic() + 90)
        await counter.start()
        started = time.perf_counter()
        start.set()
        done = _collect(out, procs, "done", processes, time.monotonic() + timeout + 30)
        commands = await counter.stop()
    except RuntimeError as exc:
        return ProcResult(None, 0, str(exc))
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
    return ProcResult(Outcome(events, violations, started, timed_out), commands)
