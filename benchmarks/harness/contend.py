"""The contended-lock workload and its analysis, shared by threads, tasks and processes."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from benchmarks.harness.report import Column
from benchmarks.harness.stats import percentile

if TYPE_CHECKING:
    from collections.abc import Callable

# One cycle: worker id, group (process) id, acquire() called, acquire() returned,
# left the critical section (just before release()), release() returned. perf_counter seconds:
# CLOCK_MONOTONIC on Linux, so timestamps of different processes on one machine compare.
Event = tuple[int, int, float, float, float, float]


class Contender(Protocol):
    """One way to take and give back the lock under test (a new lock object per cycle)."""

    async def acquire(self) -> Any: ...
    async def release(self, handle: Any) -> None: ...


@dataclass
class Outcome:
    events: list[Event]
    counter_violations: int
    started: float
    timed_out: bool = False
    most_inside: int = 0  # the most tasks seen in the critical section at once


async def contend(
    contender: Contender,
    *,
    workers: int,
    cycles: int,
    group: int = 0,
    first_worker: int = 0,
    timeout: float = 120.0,
    start: Callable[[], float] | None = None,
    limit: int = 1,
) -> Outcome:
    """``workers`` tasks each do ``cycles`` acquire / critical section / release cycles.

    The critical section increments an in-section counter, yields once with
    ``await asyncio.sleep(0)`` and decrements it; seeing the counter above ``limit`` (1 for a
    lock, the permits for a semaphore) is a violation.
    All tasks are created and parked before the clock starts. ``start`` (if given) is called
    once every task is parked, and returns the start time (it may block, for processes).
    """
    events: list[Event] = []
    inside = most = violations = 0
    gate = asyncio.Event()
    perf = time.perf_counter

    async def worker(wid: int) -> None:
        nonlocal inside, most, violations
        await gate.wait()
        for _ in range(cycles):
            t_call = perf()
            handle = await contender.acquire()
            t_acq = perf()
            inside += 1
            most = max(most, inside)
            if inside > limit:
                violations += 1
            await asyncio.sleep(0)
            inside -= 1
            t_leave = perf()
            await contender.release(handle)
            events.append((wid, group, t_call, t_acq, t_leave, perf()))

    tasks = [asyncio.create_task(worker(first_worker + i)) for i in range(workers)]
    await asyncio.sleep(0)  # every task is now parked on the gate
    started = start() if start is not None else perf()
    gate.set()
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout)
    except asyncio.TimeoutError:
        timed_out = True
    return Outcome(events, violations, started, timed_out, most)


def contend_threads(
    make_lock: Callable[[], Any], *, workers: int, cycles: int, timeout: float = 120.0
) -> Outcome:
    """The same workload with OS threads and a sync lock (``acquire()``/``release()``)."""
    events: list[Event] = []
    inside = 0
    violations = 0
    guard = threading.Lock()
    barrier = threading.Barrier(workers + 1)
    perf = time.perf_counter

    def worker(wid: int) -> None:
        nonlocal inside, violations
        barrier.wait()
        for _ in range(cycles):
            lock = make_lock()
            t_call = perf()
            lock.acquire()
            t_acq = perf()
            with guard:
                inside += 1
                if inside > 1:
                    violations += 1
            time.sleep(0)
            with guard:
                inside -= 1
            t_leave = perf()
            lock.release()
            event = (wid, 0, t_call, t_acq, t_leave, perf())
            with guard:
                events.append(event)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    started = perf()
    barrier.wait()
    deadline = started + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - perf()))
    timed_out = any(t.is_alive() for t in threads)
    return Outcome(events, violations, started, timed_out)


def analyze(
    events: list[Event], *, workers: int, started: float, counter_violations: int
) -> dict[str, float]:
    """Throughput, handoff, acquire wait, fairness and exclusion metrics of one run."""
    if not events:
        return {}
    ordered = sorted(events, key=lambda e: e[3])
    done = max(e[5] for e in ordered)
    wall = done - started
    handoffs: list[float] = []
    cross: list[float] = []
    cross_group: list[float] = []
    overlaps = 0
    latest_leave = -math.inf
    streak = longest = 0
    prev_worker = None
    for i, ev in enumerate(ordered):
        wid, grp, _call, acq, leave, _done = ev
        if acq < latest_leave:
            overlaps += 1
        latest_leave = max(latest_leave, leave)
        streak = streak + 1 if wid == prev_worker else 1
        longest = max(longest, streak)
        prev_worker = wid
        if i + 1 < len(ordered):
            nxt = ordered[i + 1]
            gap = (nxt[3] - leave) * 1e3
            handoffs.append(gap)
            if nxt[0] != wid:
                cross.append(gap)
            if nxt[1] != grp:
                cross_group.append(gap)
    waits = [(e[3] - e[2]) * 1e3 for e in ordered]
    # Fairness: acquisitions per worker while every worker was still competing, i.e. up to
    # the moment the first worker finished all of its cycles.
    finish: dict[int, float] = {}
    for e in ordered:
        finish[e[0]] = max(finish.get(e[0], -math.inf), e[4])
    first_finish = min(finish.values())
    window = Counter(e[0] for e in ordered if e[3] <= first_finish)
    counts = [window.get(w, 0) for w in finish] + [0] * (workers - len(finish))
    return {
        "cycles": float(len(ordered)),
        "wall_s": wall,
        "cycles_s": len(ordered) / wall if wall > 0 else math.nan,
        "h_p50": percentile(handoffs, 50),
        "h_p99": percentile(handoffs, 99),
        "xh_p50": percentile(cross, 50),
        "xh_p99": percentile(cross, 99),
        "xh_count": float(len(cross)),
        "xg_p50": percentile(cross_group, 50),
        "xg_p99": percentile(cross_group, 99),
        "xg_count": float(len(cross_group)),
        "w_p50": percentile(waits, 50),
        "w_p99": percentile(waits, 99),
        "w_max": max(waits),
        "fair_min": float(min(counts)),
        "fair_max": float(max(counts)),
        "streak": float(longest),
        "violations": float(counter_violations),
        "overlaps": float(overlaps),
    }


#: the table column of each metric of ``analyze``: one header and precision for every scenario
COLUMNS = {
    column.metric: column
    for column in (
        Column("cycles/s", "cycles_s"),
        Column("handoff p50 ms (all)", "h_p50", 3),
        Column("handoff p99 ms (all)", "h_p99", 3),
        Column("cross-worker handoff p50 ms", "xh_p50", 3),
        Column("cross-worker handoff p99 ms", "xh_p99", 3),
        Column("cross-worker handoffs / run", "xh_count"),
        Column("cross-process handoff p50 ms", "xg_p50", 3),
        Column("cross-process handoff p99 ms", "xg_p99", 3),
        Column("cross-process handoffs / run", "xg_count"),
        Column("acquire wait p50 ms", "w_p50", 3),
        Column("acquire wait p99 ms", "w_p99", 1),
        Column("acquire wait max ms", "w_max", 1),
        Column("longest same-worker streak", "streak"),
        Column("counter violations", "violations"),
        Column("interval overlaps", "overlaps"),
        Column("cycles / run", "cycles"),
        Column("Redis commands per cycle", "cmds_cycle", 2),  # set by _rounds where counted
    )
}


def columns(*picks: str | Column) -> list[Column]:
    """Table columns in order: a metric name is its ``COLUMNS`` entry, a ``Column`` itself."""
    return [COLUMNS[pick] if isinstance(pick, str) else pick for pick in picks]
