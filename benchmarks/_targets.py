"""The ``targets`` block of docs/benchmarks.md: issue #6's targets against the stored results."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from benchmarks import _contended, _growth, _memory, _uncontended
from benchmarks._stats import Spread, fmt, fmt_spread

if TYPE_CHECKING:
    from benchmarks._results import View

MET, NOT_MET, NOT_RUN = "**met**", "**not met**", "n/a (scenario not run)"


def _s(spread: Spread, digits: int) -> str:
    return fmt_spread(spread, digits) if spread.count else "n/a"


def _uncontended_row(view: View) -> list[str]:
    sc, me = "uncontended", _uncontended.ASYNCLOCK
    ratio = view.spread(sc, me, "x_redispy")
    target = "Uncontended acquire+release throughput >= 1.2x redis-py's `Lock` (Redis)"
    if not ratio.count:
        return [target, "n/a", NOT_RUN]
    mine = view.spread(sc, me, "pairs_s").median
    theirs = view.spread(sc, _uncontended.REDISPY, "pairs_s").median
    measured = (
        f"{_s(ratio, 2)}x (median of per-round ratios, min-max); {fmt(mine, 0)} against "
        f"{fmt(theirs, 0)} pairs/s"
    )
    verdict = MET if ratio.median >= 1.2 else NOT_MET
    if ratio.median >= 1.2 > ratio.low:
        verdict += " (median; some rounds below 1.2x)"
    return [target, measured, verdict]


def _counts(view: View, base: str, metric: str) -> list[tuple[int, Spread]]:
    """(task count, spread) of ``base`` at every task count of the sweep that has ``metric``."""
    out = []
    for n in _contended.TASK_COUNTS:
        spread = view.spread("contended", _contended.label(base, n), metric)
        if spread.count:
            out.append((n, spread))
    return out


def _others(view: View, base: str, metric: str, digits: int) -> str:
    """``metric`` of ``base`` at the task counts other than 16, for the measured cell."""
    parts = [
        f"{n} tasks {_s(sp, digits)}"
        for n, sp in _counts(view, base, metric)
        if n != _contended.WORKERS
    ]
    return "; ".join(parts)


def _handoff_rows(view: View) -> list[list[str]]:
    sc = "contended"
    rows: list[list[str]] = []
    me = _contended.label(_contended.ASYNCLOCK, _contended.WORKERS)
    p50 = view.spread(sc, me, "xh_p50")
    p99 = view.spread(sc, me, "xh_p99")
    counts = ", ".join(str(n) for n in _contended.TASK_COUNTS)
    target = f"Contended handoff p50 < 0.5 ms ({counts} tasks on one key, one process)"
    if not p50.count:
        return [[target, "n/a", NOT_RUN]]
    redispy = view.spread(sc, _contended.label(_contended.REDISPY, _contended.WORKERS), "xh_p50")
    measured = (
        f"16 tasks: p50 {_s(p50, 3)} ms, p99 {_s(p99, 3)} ms (redis-py default: p50 "
        f"{_s(redispy, 1)} ms)"
    )
    others = _others(view, _contended.ASYNCLOCK, "xh_p50", 3)
    if others:
        measured += f"; p50 at {others} ms"
    every = _counts(view, _contended.ASYNCLOCK, "xh_p50")
    verdict = MET if all(sp.median < 0.5 for _, sp in every) else NOT_MET
    if verdict == MET and any(sp.high >= 0.5 for _, sp in every):
        verdict += " (median; some rounds above)"
    rows.append([target, measured, verdict])
    multi = next((v for v in view.variants(sc, "xg_p50") if "asynclock" in v), None)
    if multi is not None:
        xg = view.spread(sc, multi, "xg_p50")
        xg99 = view.spread(sc, multi, "xg_p99")
        verdict = MET if xg.median < 0.5 else NOT_MET
        rows.append(
            [
                "... across 3 processes x 6 tasks (cross-process handoffs)",
                f"p50 {_s(xg, 3)} ms, p99 {_s(xg99, 3)} ms",
                verdict,
            ]
        )
    return rows


def _fairness_row(view: View) -> list[str]:
    sc = "contended"
    target = "FIFO fairness under contention"
    streaks = _counts(view, _contended.ASYNCLOCK, "streak")
    if not streaks:
        return [target, "n/a", NOT_RUN]
    worst = max(sp.high for _, sp in streaks)
    parts = []
    for n, _ in streaks:
        low = view.spread(sc, _contended.label(_contended.ASYNCLOCK, n), "fair_min")
        high = view.spread(sc, _contended.label(_contended.ASYNCLOCK, n), "fair_max")
        parts.append(f"{n} tasks {_s(low, 0)} / {_s(high, 0)}")
    theirs = _others(view, _contended.REDISPY, "streak", 0)
    theirs16 = view.spread(sc, _contended.label(_contended.REDISPY, _contended.WORKERS), "streak")
    measured = (
        f"longest same-worker streak at most {fmt(worst, 0)} in every round at every task "
        f"count; min / max acquisitions per worker while all compete: {'; '.join(parts)} "
        f"(redis-py default: streak 16 tasks {_s(theirs16, 0)}; {theirs})"
    )
    return [target, measured, MET if worst <= 1 else NOT_MET]


def _throughput_row(view: View) -> list[str]:
    sc = "contended"
    counts = ", ".join(str(n) for n in _contended.TASK_COUNTS)
    target = f"Contended throughput >= redis-py's `Lock` ({counts} tasks)"
    me = _contended.label(_contended.ASYNCLOCK, _contended.WORKERS)
    slow = view.spread(sc, me, "x_redispy")
    fast = view.spread(sc, me, "x_redispy_fast")
    if not slow.count:
        return [target, "n/a", NOT_RUN]
    cycles = view.spread(sc, me, "cycles_s")
    measured = (
        f"16 tasks: {_s(slow, 2)}x redis-py with its default `sleep=0.1`, {_s(fast, 2)}x with "
        f"`sleep=0.001` ({fmt(cycles.median, 0)} cycles/s)"
    )
    for n in _contended.TASK_COUNTS:
        if n == _contended.WORKERS:
            continue
        mine = _contended.label(_contended.ASYNCLOCK, n)
        a, b = view.spread(sc, mine, "x_redispy"), view.spread(sc, mine, "x_redispy_fast")
        if a.count:
            measured += f"; {n} tasks: {_s(a, 2)}x / {_s(b, 2)}x"
    lows = [
        sp.low
        for metric in ("x_redispy", "x_redispy_fast")
        for _, sp in _counts(view, _contended.ASYNCLOCK, metric)
    ]
    return [target, measured, MET if min(lows) >= 1.0 else NOT_MET + " in some rounds"]


def _memory_row(view: View) -> list[str]:
    sc = "memory"
    target = "MemoryState acquire+release cost <= 3x `asyncio.Lock`"
    cost = view.spread(sc, _memory.MEMORY, "t_ideal")
    if not cost.count:
        return [target, "n/a", NOT_RUN]
    us = view.spread(sc, _memory.MEMORY, "us_pair")
    measured = f"{_s(cost, 0)}x ({_s(us, 1)} µs per pair)"
    shipped = view.spread(sc, _memory.S_AS_SHIPPED, "us")
    bare = view.spread(sc, _memory.S_NO_YIELD, "us")
    ideal = view.spread(sc, _memory.S_IDEAL, "us")
    yields = view.spread(sc, _memory.S_AS_SHIPPED, "yields")
    if shipped.count and bare.count and ideal.count:
        share = view.spread(sc, _memory.S_AS_SHIPPED, "share_yields")
        measured += (
            f"; split: {fmt(yields.median, 0)} event-loop yields are {_s(share, 0)}% of it, "
            f"without them {fmt(bare.median, 2)} µs = {fmt(bare.median / ideal.median, 0)}x"
        )
    return [target, measured, NOT_MET + " (by design: see below)" if cost.median > 3 else MET]


def _growth_row(view: View) -> list[str]:
    sc = "memory-growth"
    target = "Memory flat after the sweep (MemoryState, 1,000,000 distinct keys)"
    left = view.spread(sc, _growth.SHORT, "after_entries")
    if not left.count:
        return [target, "n/a", NOT_RUN]
    keys = view.spread(sc, _growth.SHORT, "keys").median
    grow = view.spread(sc, _growth.SHORT, "growth_after_fill")
    fill = view.spread(sc, _growth.SHORT, "fill_keys")
    end = view.spread(sc, _growth.SHORT, "end_entries")
    before = view.spread(sc, _growth.SHORT, "rss_before")
    peak = view.spread(sc, _growth.SHORT, "rss_peak")
    control = view.spread(sc, _growth.CONTROL, "growth_after_fill")
    control_peak = view.spread(sc, _growth.CONTROL, "rss_peak")
    measured = (
        f"{fmt(keys, 0)} keys: RSS {fmt(before.median, 0)} MiB before, peak "
        f"{_s(peak, 0)} MiB, then +{_s(grow, 1)} MiB from key {fmt(fill.median, 0)} (TTL "
        f"window full) to the last; entries "
        f"{fmt(end.median, 0)} at the end, {_s(left, 0)} after the TTL and the sweep (the "
        f"sweep traffic's own duplicate id). Control with nothing expiring: peak "
        f"{_s(control_peak, 0)} MiB, +{_s(control, 1)} MiB over the same keys. Flat: growth "
        f"after the window filled <= 10% of the control's, and no entry left"
    )
    if not (grow.count and control.count):
        return [target, measured, "n/a (incomplete: run memory-growth again)"]
    flat = left.high <= 1 and grow.median <= 0.1 * control.median
    target_text = target if keys >= 1_000_000 else target + f" (this run: {fmt(keys, 0)}, --quick)"
    return [target_text, measured, MET if flat else NOT_MET]


def _why_memory(view: View) -> str:
    sc = "memory"
    text = (
        "**Why MemoryState is not within 3x of `asyncio.Lock`.** `asyncio.Lock.acquire()` on a "
        "free lock sets a flag and returns without suspending, and `release()` is a plain "
        "method: about 0.1 µs for the pair. Every asynclock operation instead yields to the "
        "event loop once before it acts, by design (the yield rule of STYLE.md 9.7, trio's "
        "checkpoint rule): a tight `async with lock:` loop cannot starve the other tasks, and a "
        "cancellation lands either before the operation or not at all, never halfway. So a "
        "pair is two passes of the event loop, each of which alone costs an order of magnitude "
        "more than the whole `asyncio.Lock` pair. The rest is what a distributed lock's "
        "in-process backend does and `asyncio.Lock` does not: a fresh owner id per "
        "acquisition, the per-key FIFO line and task checks (the AsyncLock layer), and in the "
        "State a fencing token, a TTL deadline pushed on the sweep heap, the sweep itself, a "
        "`threading.Lock` (the state is shared across event loops) and `Grant`/`Release` "
        "records."
    )
    shipped = view.spread(sc, _memory.S_AS_SHIPPED, "us").median
    bare = view.spread(sc, _memory.S_NO_YIELD, "us").median
    state = view.spread(sc, _memory.S_STATE, "us").median
    ideal = view.spread(sc, _memory.S_IDEAL, "us").median
    loop_pass = view.spread(sc, _memory.S_YIELD, "us").median
    if not any(math.isnan(x) for x in (shipped, bare, state, ideal, loop_pass)):
        text += (
            f" Measured (medians, `memory` section): {shipped:.1f} µs per pair = "
            f"{shipped - bare:.1f} µs for the two yields ({(shipped - bare) / shipped:.0%}; one "
            f"bare `await asyncio.sleep(0)` is {loop_pass:.1f} µs) + {bare - state:.1f} µs of "
            f"AsyncLock's layer + {state:.1f} µs in MemoryState's `acquire`/`release`, against "
            f"{ideal:.2f} µs for `asyncio.Lock`. Even with no yield at all it would be "
            f"{bare / ideal:.0f}x, and the State calls alone {state / ideal:.0f}x: the 3x target "
            "is out of reach for a pure-Python lock with owners, tokens and expiry (3x "
            f"`asyncio.Lock` is {3 * ideal:.2f} µs, the cost of a few Python calls), and the "
            "yield rule is kept on purpose. We report the gap instead of chasing it."
        )
    text += (
        " Under contention the gap is much smaller (the `memory` section's 16-task row), "
        "because there `asyncio.Lock` suspends too."
    )
    return text


def markdown(view: View) -> str:
    rows = [_uncontended_row(view), *_handoff_rows(view), _fairness_row(view)]
    rows += [_throughput_row(view), _memory_row(view), _growth_row(view)]
    lines = [
        "## Targets",
        "",
        (
            "The targets of issue #6 against the stored results of the last run of each "
            "scenario (`benchmarks/results/last-run.json`; cells are median (min-max) over the "
            "rounds). Written by `--write` from the numbers, not by hand."
        ),
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
    ]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in rows]
    lines += [
        "",
        _why_memory(view),
    ]
    return "\n".join(lines)
