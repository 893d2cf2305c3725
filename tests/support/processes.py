"""The OS-process harness of the tests.

Spawned workers (multiprocessing *spawn*: a fresh interpreter that imports only the worker's
module and asynclock, not pytest's collection):

* worker side, :func:`report_back`: run the worker's coroutine in an event loop of its own and
  put its plain-dict answer on the results queue; never raises, so the parent always gets an
  answer (an ``"error"`` entry with the traceback when something failed);
* parent side, :func:`run_processes`: start several behind one start barrier, collect their
  answers, fail the test on any error; :func:`spawned`: one process the test kills on purpose.

Commands (``subprocess``) started in a session of their own, so that a signal reaches the
children they fork (uvicorn's and taskiq's workers): :func:`start_group`, :func:`kill_group`,
:func:`stop_groups`; :class:`WorkerProcesses`: the worker commands of one test, each with its
output in a log file of its own for the failure message.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import subprocess
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
    from multiprocessing.context import SpawnProcess
    from multiprocessing.queues import Queue

#: seconds the parent waits for each worker's answer, then for each one to exit
ANSWER_BOUND = 100.0
EXIT_BOUND = 20.0


def report_back(results: Queue[dict[str, Any]], run: Coroutine[Any, Any, dict[str, Any]]) -> None:
    """Worker side: run ``run`` in a new event loop and put its answer on ``results``.

    Any failure becomes ``{"error": <traceback>, "pid": <pid>}``: the parent fails the test with
    it instead of waiting for an answer that never comes.
    """
    try:
        answer: dict[str, Any] = asyncio.run(run)
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        answer = {"error": traceback.format_exc(), "pid": os.getpid()}
    results.put(answer)


async def run_processes(
    targets: Sequence[tuple[Callable[..., None], Sequence[object]]],
) -> list[dict[str, Any]]:
    """Start one spawned process per ``(function, args)`` behind one start barrier.

    Each function gets ``*args`` and then ``(barrier, results)``, and answers through
    :func:`report_back`. Returns their answers, once every one answered without an error, each
    from a process of its own.
    """
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(targets))
    results: Any = ctx.Queue()
    procs = [
        ctx.Process(target=function, args=(*args, barrier, results), daemon=True)
        for function, args in targets
    ]
    for proc in procs:
        proc.start()
    try:
        reports = [await asyncio.to_thread(results.get, True, ANSWER_BOUND) for _ in procs]
        for proc in procs:
            await asyncio.to_thread(proc.join, EXIT_BOUND)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        results.close()
        results.join_thread()
    errors = [report["error"] for report in reports if "error" in report]
    assert not errors, "\n".join(errors)
    assert len({report["pid"] for report in reports}) == len(targets)
    return reports


@contextlib.asynccontextmanager
async def spawned(target: Callable[..., None], *args: object) -> AsyncIterator[SpawnProcess]:
    """One spawned (daemon) process running ``target(*args)``, killed on the way out if it
    still runs: for a test that kills it itself (``os.kill(proc.pid, signal.SIGKILL)``)."""
    proc = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    proc.start()
    try:
        yield proc
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()


def start_group(
    command: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``command`` in a session (process group) of its own, its output to ``log`` if
    given, so that :func:`kill_group` and :func:`stop_groups` reach whatever it forks."""
    if log is None:
        return subprocess.Popen(command, cwd=cwd, env=env, start_new_session=True)
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group of ``process`` (no shutdown hook, as in a crash) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def stop_groups(processes: Sequence[subprocess.Popen[bytes]], within: float) -> None:
    """SIGTERM the process group of each process (its leader may be gone, its children not);
    SIGKILL what is left after ``within`` seconds (all of them together, not each)."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + within
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.0, deadline - time.monotonic()))
        if process.poll() is None:
            kill_group(process)


class WorkerProcesses:
    """The worker commands of one test, each in a process group of its own, each one's output
    in ``folder/worker-<n>.log`` (:meth:`output` for the failure message)."""

    def __init__(self, prefix: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=prefix))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []

    def launch(
        self, command: Sequence[str], *, cwd: Path, env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """Start one more worker."""
        log = self.folder / f"worker-{len(self.processes)}.log"
        process = start_group(command, cwd=cwd, env=env, log=log)
        self.processes.append(process)
        self.logs.append(log)
        return process

    def output(self, tail: int | None = None) -> str:
        """Every worker's log (its last ``tail`` characters), one after the other."""
        return "\n".join(
            f"--- {log.name}\n{log.read_text()[-tail:] if tail else log.read_text()}"
            for log in self.logs
        )

    def kill(self) -> None:
        """SIGKILL every running worker (its whole group): no shutdown hook, as in a crash."""
        for process in self.processes:
            if process.poll() is None:
                kill_group(process)

    def stop(self, within: float) -> list[int]:
        """SIGTERM every running worker (the leader, which stops what it forked) and wait up
        to ``within`` seconds for each; SIGKILL one that does not stop. Their exit codes."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=within))
            except subprocess.TimeoutExpired:  # noqa: PERF203 - a worker that does not stop
                kill_group(process)
                codes.append(process.wait())
        return codes
