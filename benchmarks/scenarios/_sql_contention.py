"""The contention part of the ``sql`` scenario: one key, 16 tasks in one process, 3 processes.

Every backend's state runs the shared workload (``_contend.contend``) in this process and in
spawned children (``_spawn``); the rows run interleaved (``_rounds.contention_rounds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from benchmarks.harness import spawn as _spawn
from benchmarks.harness.contend import contend
from benchmarks.harness.contenders import AsynclockContender
from benchmarks.harness.env import (
    Asynclock,
    Config,
    log,
)
from benchmarks.harness.report import Rounds
from benchmarks.harness.rounds import ContentionRow, ContentionRun, close_all, contention_rounds
from benchmarks.harness.sql_server import BACKENDS
from benchmarks.harness.states import STATE_CLASSES, open_state, warm_state
from benchmarks.scenarios._sql_variants import short

if TYPE_CHECKING:
    from collections.abc import Awaitable

WORKERS = 16
PROCESSES = 3
TASKS_PER_PROCESS = 4


@dataclass
class Contention:
    """The two tables of the part: 16 tasks in one process, and the spawned processes."""

    single: Rounds = field(default_factory=Rounds)
    multi: Rounds = field(default_factory=Rounds)


def cycles_per_task(cfg: Config) -> tuple[int, int]:
    """Cycles per task: (16 tasks in one process, 3 processes x 4 tasks)."""
    return (30, 25) if cfg.quick else (100, 50)


def single_name(backend: str) -> str:
    """The row of ``backend``'s state in the one-process table."""
    return f"**asynclock** {STATE_CLASSES[backend]}, {WORKERS} tasks"


def multi_name(backend: str) -> str:
    """The row of ``backend``'s state in the multi-process table."""
    cls = STATE_CLASSES[backend]
    return f"**asynclock** {cls}, {PROCESSES} processes x {TASKS_PER_PROCESS} tasks"


async def run_contention(
    cfg: Config, api: Asynclock, prefix: str, urls: dict[str, str], rounds_n: int
) -> Contention:
    """Both tables of every backend: warmed up, then interleaved for ``rounds_n`` rounds."""
    out = Contention()
    cycles, multi_cycles = cycles_per_task(cfg)
    timeout = 60.0 if cfg.quick else 120.0
    states: dict[str, Any] = {}
    rows: dict[str, ContentionRow] = {}
    lock_cls = api.lock_factory()

    for backend in BACKENDS:
        name = single_name(backend)
        out.single.declare(name)
        key = f"{backend}:contended"
        try:
            state = open_state(api, backend, urls[backend], prefix)
            states[backend] = state
            await warm_state(state, key)
            contender = AsynclockContender(lock_cls, state, key)
            warm = await contend(contender, workers=WORKERS, cycles=2, timeout=30)
            if warm.timed_out:
                raise RuntimeError("warm-up (16 tasks x 2 cycles) timed out")
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            out.single.skip(name, f"{type(exc).__name__}: {exc}".splitlines()[0])
            log(f"sql contended: {name} skipped: {exc!r}")
            continue

        def single(contender: AsynclockContender = contender) -> Awaitable[ContentionRun]:
            async def go() -> ContentionRun:
                outcome = await contend(contender, workers=WORKERS, cycles=cycles, timeout=timeout)
                return outcome, None, None

            return go()

        rows[name] = ContentionRow(single, out.single, WORKERS)

    for backend in BACKENDS:
        name = multi_name(backend)
        out.multi.declare(name)
        if backend not in states:
            out.multi.skip(name, "the backend failed in the single-process rows")
            continue

        def multi(backend: str = backend) -> Awaitable[ContentionRun]:
            async def go() -> ContentionRun:
                result = await _spawn.run_processes(
                    contender=backend,
                    url=urls[backend],
                    prefix=prefix,
                    key=f"{backend}:procs",
                    processes=PROCESSES,
                    tasks=TASKS_PER_PROCESS,
                    cycles=multi_cycles,
                    timeout=timeout,
                    warm_watch=True,
                )
                return result.outcome, None, result.error

            return go()

        rows[name] = ContentionRow(multi, out.multi, PROCESSES * TASKS_PER_PROCESS)

    closers = [state.aclose for state in states.values()]
    try:
        await contention_rounds(
            rows, rounds_n=rounds_n, timeout=timeout, scenario="sql contended", tag=short
        )
    finally:
        await close_all(closers, "sql contended")
    return out
