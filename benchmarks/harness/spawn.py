"""The process-spawning harness of every multi-process row.

``Children`` spawns processes that report on one queue and waits for their messages, a dead or
failed child ending the wait (the ``cluster`` scenario's workers are such children, fed by
command queues). ``run_processes`` uses it for N processes x M tasks contending for one key:
each child opens its contender (redis-py's Lock, or asynclock's ``AsyncLock`` on a state of any
backend built from its URL), warms up on a key of its own, reports ready and waits for the
parent's one start signal. It then runs the shared workload (``_contend.contend``) and sends back
its timestamped cycles; the parent merges them (perf_counter is CLOCK_MONOTONIC: one clock for
the whole machine), so the analysis sees one timeline with cross-process handoffs on it.
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

from benchmarks.harness.contend import Event, Outcome, contend
from benchmarks.harness.contenders import AsynclockContender, RedisPyContender
from benchmarks.harness.env import require_asynclock
from benchmarks.harness.states import open_state, warm_state

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from multiprocessing.synchronize import Event as MpEvent

    from benchmarks.harness.contend import Contender
    from benchmarks.harness.env import CommandCounter

#: the child contender that is redis-py's asyncio Lock (sleep=0.1); every other contender name is
#: an asynclock backend of ``_states.STATE_CLASSES`` ("redis", "postgres", "mysql")
REDISPY = "redis-py"


@dataclass(frozen=True)
class ChildArgs:
    """What one child of ``run_processes`` runs: child ``index`` of the run, ``tasks`` x ``cycles``."""

    contender: str
    url: str
    prefix: str
    key: str
    index: int
    tasks: int
    cycles: int
    timeout: float
    warm_watch: bool


async def _open(
    args: ChildArgs,
) -> tuple[Callable[[str], Contender], Callable[[], Awaitable[None]], Any]:
    """A contender factory by key, its closer, and the asynclock state (None for redis-py)."""
    if args.contender == REDISPY:
        client = redis.asyncio.Redis.from_url(args.url)
        return (lambda key: RedisPyContender(client, key)), client.aclose, None
    api = require_asynclock()
    state = open_state(api, args.contender, args.url, args.prefix)
    lock_cls = api.lock_factory()
    return (lambda key: AsynclockContender(lock_cls, state, key)), state.aclose, state


async def _child(args: ChildArgs, start: MpEvent, close: MpEvent, out: Any) -> None:
    make, aclose, state = await _open(args)
    try:
        warm_key = f"{args.key}:warm:{args.index}"
        if args.warm_watch and state is not None:
            await warm_state(state, warm_key)
        warm = await contend(
            make(warm_key), workers=args.tasks, cycles=3, group=args.index, timeout=30
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


def child_main(args: ChildArgs, start: MpEvent, close: MpEvent, out: Any) -> None:
    """Entry point of a spawned child."""
    try:
        asyncio.run(_child(args, start, close, out))
    except BaseException:  # noqa: BLE001 (reported, never fatal)
        out.put(("error", args.index, traceback.format_exc(limit=5)))


@dataclass
class ProcResult:
    """The merged cycles of every child (None on failure), the server's command count, why."""

    outcome: Outcome | None
    commands: int
    error: str | None = None


class Children:
    """Spawned child processes that all report on one queue, ``out``.

    Every child is called as ``target(*args, out)`` (``target(*args, commands, out)`` when it
    has a command queue of its own) and puts tuples on ``out`` whose first item names the
    message kind; ``("error", index, traceback)`` is a child that failed.
    """

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.out: Any = self.ctx.Queue()
        self.procs: list[Any] = []
        self.commands: list[Any] = []

    def start(
        self, target: Callable[..., None], args: list[tuple[Any, ...]], *, commands: bool = False
    ) -> None:
        """Spawn one daemon child per tuple of ``args``; with ``commands``, each gets a queue."""
        self.commands = [self.ctx.Queue() for _ in args] if commands else []
        own: list[tuple[Any, ...]] = [(q,) for q in self.commands] or [() for _ in args]
        self.procs = [
            self.ctx.Process(target=target, args=(*one, *mine, self.out), daemon=True)
            for one, mine in zip(args, own, strict=True)
        ]
        for proc in self.procs:
            proc.start()

    def send(self, index: int, message: Any) -> None:
        """Put ``message`` on the command queue of child ``index``."""
        self.commands[index].put(message)

    def next(self, remaining: float) -> tuple[Any, ...] | None:
        """The next message, or None if none came within ``remaining`` s (at most 0.5 s).

        Raises RuntimeError when a child reports an error or died: whatever the parent was
        waiting for then never comes.
        """
        try:
            msg: tuple[Any, ...] = self.out.get(timeout=min(0.5, remaining))
        except queue.Empty:
            dead = [p.exitcode for p in self.procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a child died with exit code {dead[0]}") from None
            return None
        if msg[0] == "error":
            raise RuntimeError(f"child {msg[1]} failed:\n{msg[2]}")
        return msg

    def collect(self, kind: str, count: int, timeout: float) -> list[tuple[Any, ...]]:
        """Block until ``count`` messages of ``kind`` came (others are dropped); see ``next``.

        Raises RuntimeError too when ``timeout`` s pass first.
        """
        got: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"timed out waiting for {count - len(got)} '{kind}' message(s)")
            msg = self.next(remaining)
            if msg is not None and msg[0] == kind:
                got.append(msg)
        return got

    def join(self) -> None:
        """Tell the children with a command queue to end (None), wait for every child to end;
        terminate the ones that do not."""
        for commands in self.commands:
            commands.put(None)
        for proc in self.procs:
            proc.join(15)
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()  # only our own children, by object
                proc.join(5)


async def run_processes(
    *,
    contender: str,
    url: str,
    prefix: str,
    key: str,
    processes: int,
    tasks: int,
    cycles: int,
    timeout: float,
    counter: CommandCounter | None = None,
    warm_watch: bool = False,
) -> ProcResult:
    """Spawn ``processes`` children, start them together on one signal, merge their cycles.

    ``counter`` (if given) counts the server's commands over the timed run; ``warm_watch``
    opens each child's wake-up subscription before its warm-up (``_states.warm_state``).
    The waits block on purpose: the parent's loop has nothing else to run meanwhile.
    """
    children = Children()
    start, close = children.ctx.Event(), children.ctx.Event()
    children.start(
        child_main,
        [
            (
                ChildArgs(contender, url, prefix, key, i, tasks, cycles, timeout, warm_watch),
                start,
                close,
            )
            for i in range(processes)
        ],
    )
    commands = 0
    try:
        children.collect("ready", processes, 90)
        if counter is not None:
            await counter.start()
        started = time.perf_counter()
        start.set()
        done = children.collect("done", processes, timeout + 30)
        if counter is not None:
            commands = await counter.stop()
    except RuntimeError as exc:
        return ProcResult(None, 0, str(exc))
    finally:
        close.set()
        children.join()
    events: list[Event] = [ev for msg in done for ev in msg[2]]
    violations = sum(int(msg[3]) for msg in done)
    timed_out = any(bool(msg[4]) for msg in done)
    return ProcResult(Outcome(events, violations, started, timed_out), commands)
