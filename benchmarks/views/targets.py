"""The ``targets`` block of docs/benchmarks.md: issues #6 and #16 against the stored results.

Every verdict is computed here from ``benchmarks/summary/medians.json``, never written by hand;
a scenario that has not stored its numbers yet gives ``n/a``. #16's targets have a floor (what
the issue requires) and some a goal beyond it: the verdict is on the floor and says whether the
goal is reached too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from benchmarks.harness.report import kept
from benchmarks.harness.stats import Spread, fmt, fmt_spread
from benchmarks.scenarios import contended as _contended
from benchmarks.scenarios import dispatcher as _dispatcher
from benchmarks.scenarios import held as _held
from benchmarks.scenarios import memory as _memory
from benchmarks.scenarios import memory_growth as _growth
from benchmarks.scenarios import sql as _sql
from benchmarks.scenarios import sql_dispatcher as _sql_dispatcher
from benchmarks.scenarios import uncontended as _uncontended

if TYPE_CHECKING:
    from benchmarks.harness.results import View

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
    return [target, measured, _within(ratio, 1.2, higher=True)]


def _within(ratio: Spread, bound: float, *, higher: bool) -> str:
    """Met on the median against ``bound``, saying when some rounds fell on the other side."""
    if not ((ratio.median >= bound) if higher else (ratio.median <= bound)):  # NaN: not met
        return NOT_MET
    if (ratio.low < bound) if higher else (ratio.high > bound):
        return MET + f" (median; some rounds {'below' if higher else 'above'} {bound}x)"
    return MET


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


def _graded(value: float, floor: float, goal: float | None, *, higher: bool) -> str:
    """The verdict on ``floor``, and whether ``goal`` is reached too (higher or lower is better)."""

    def reached(bound: float) -> bool:
        return value >= bound if higher else value <= bound

    if not reached(floor):
        return NOT_MET
    if goal is None or goal == floor:
        return MET
    return MET + (" (the goal too)" if reached(goal) else f" (floor; goal {fmt(goal, 1)}x not yet)")


def _dispatcher_rows(view: View) -> list[list[str]]:
    sc, rows = "dispatcher", []
    for mode, mine, peer in (
        ("serial", _dispatcher.M_ASYNCLOCK, _dispatcher.M_CHAT),
        ("burst", _dispatcher.M_ASYNCLOCK_B, _dispatcher.M_CHAT_B),
        (
            "burst under `latest` (chat-sdk queue's semantics)",
            _dispatcher.M_ASYNCLOCK_L,
            _dispatcher.M_CHAT_B,
        ),
    ):
        target = (
            f"Dispatcher on `MemoryState` >= 1.0x chat-sdk's memory dispatcher, {mode} (goal 2x)"
        )
        ratio = view.spread(sc, mine, "x_chat")
        if not ratio.count:
            rows.append([target, "n/a", NOT_RUN])
            continue
        ours = view.spread(sc, mine, "events_s").median
        theirs = view.spread(sc, peer, "events_s").median
        measured = f"{_s(ratio, 2)}x; {fmt(ours, 0)} against {fmt(theirs, 0)} events/s"
        verdict = _graded(ratio.median, 1.0, 2.0, higher=True)
        if mode.startswith("burst"):
            lost = view.spread(sc, mine, "dropped")
            dropped = view.spread(sc, peer, "dropped")
            handled = view.spread(sc, mine, "xh_chat")
            measured += f"; dropped {_s(lost, 0)} (chat-sdk {_s(dropped, 0)})"
            if handled.count:
                measured += f"; handled events/s {_s(handled, 2)}x chat-sdk's"
            if lost.count and lost.high > 0:
                verdict = NOT_MET + " (events dropped)"
        rows.append([target, measured, verdict])
    return rows


def _anyio_rows(view: View) -> list[list[str]]:
    sc, me = "memory", _memory.MEMORY
    twice = view.spread(sc, me, "t_anyio2")
    once = view.spread(sc, me, "t_anyio")
    targets = (
        (
            "`AsyncLock` on `MemoryState` <= 1.5x `anyio.Lock` + a checkpoint per uncontended "
            "pair (the anchor with asynclock's two checkpoints; goal 1.0x)"
        ),
        "... and against plain `anyio.Lock` (it checkpoints in acquire only): goal 1.0x",
    )
    if not twice.count:
        return [[target, "n/a", NOT_RUN] for target in targets]
    us = view.spread(sc, me, "us_pair")
    anchor = view.spread(sc, _memory.ANYIO_2, "us_pair")
    plain = view.spread(sc, _memory.ANYIO, "us_pair")
    return [
        [
            targets[0],
            f"{_s(twice, 2)}x ({_s(us, 1)} against {_s(anchor, 1)} µs per pair)",
            _graded(twice.median, 1.5, 1.0, higher=False),
        ],
        [
            targets[1],
            f"{_s(once, 2)}x ({_s(plain, 1)} µs per pair)",
            _graded(once.median, 1.0, None, higher=False),
        ],
    ]


def _held_rows(view: View) -> list[list[str]]:
    """One row per backend of the ``held`` scenario: met where the median ratio is <= 1.2x."""
    sc, bound = "held", _held.TARGET
    target = f"Cost of a pair independent of the locks the task holds: <= {bound}x with "
    target += f"{_held.HELD:,} held (`held`; fastest chunk of each timing)"
    peer = view.spread(sc, _held.REDISPY, "ratio")
    rows = []
    for i, (variant, backend) in enumerate(_held.ASYNCLOCK_ROWS):
        what = f"{target}: {backend}" if i == 0 else f"... {backend}"
        ratio = view.spread(sc, variant, "ratio")
        if not ratio.count:
            missing = NOT_RUN if view.scenario(sc) is None else "n/a (skipped: see `held`)"
            rows.append([what, "n/a", missing])
            continue
        alone = view.spread(sc, variant, "us_alone").median
        held = view.spread(sc, variant, "us_held").median
        every = view.spread(sc, variant, "ratio_all")
        measured = (
            f"{_s(ratio, 2)}x ({fmt(alone, 1)} µs alone, {fmt(held, 1)} µs held; over every "
            f"chunk {_s(every, 2)}x)"
        )
        if variant == _held.REDIS and peer.count:
            measured += f"; redis-py's `Lock` on the same server: {_s(peer, 2)}x"
        rows.append([what, measured, _within(ratio, bound, higher=False)])
    return rows


def _sql_dispatcher_rows(view: View) -> list[list[str]]:
    sc, me = "sql-dispatcher", _sql_dispatcher.P_ASYNCLOCK
    statements = view.spread(sc, me, "statements_event")
    ratio = view.spread(sc, me, "x_chat")
    first = "PostgreSQL dispatcher: 2 statements per fresh event"
    second = "PostgreSQL dispatcher >= 1.3x chat-sdk's PostgreSQL dispatcher (serial, drop)"
    rows = []
    if statements.count:
        measured = f"PostgresState {_s(statements, 2)}"
        mysql = view.spread(sc, _sql_dispatcher.M_ASYNCLOCK, "statements_event")
        chat = view.spread(sc, _sql_dispatcher.P_CHAT, "statements_event")
        if mysql.count:
            measured += f"; MySQLState on MariaDB {_s(mysql, 2)} (no target)"
        if chat.count:
            measured += f"; chat-sdk {_s(chat, 2)}"
        rows.append([first, measured, MET if statements.median <= 2.0 else NOT_MET])
    else:
        rows.append([first, "n/a", NOT_RUN])
    if ratio.count:
        ours = view.spread(sc, me, "events_s").median
        theirs = view.spread(sc, _sql_dispatcher.P_CHAT, "events_s").median
        measured = f"{_s(ratio, 2)}x; {fmt(ours, 0)} against {fmt(theirs, 0)} events/s"
        rows.append([second, measured, _within(ratio, 1.3, higher=True)])
    else:
        rows.append([second, "n/a", NOT_RUN])
    return rows


def _mysql_handoff_row(view: View) -> list[str]:
    sc, me = "sql", _sql.multi_name("mysql")
    target = (
        "MySQL/MariaDB cross-process handoff p50 <= 5 ms, p99 <= 20 ms "
        f"({_sql.PROCESSES} processes x {_sql.TASKS_PER_PROCESS} tasks)"
    )
    p50 = view.spread(sc, me, "xg_p50")
    p99 = view.spread(sc, me, "xg_p99")
    if not p50.count:
        return [target, "n/a", NOT_RUN]
    measured = f"p50 {_s(p50, 2)} ms, p99 {_s(p99, 2)} ms"
    pg = view.spread(sc, _sql.multi_name("postgres"), "xg_p50")
    if pg.count:
        measured += f" (PostgresState p50 {_s(pg, 2)} ms)"
    return [target, measured, MET if p50.median <= 5.0 and p99.median <= 20.0 else NOT_MET]


#: commands a contended run spends beyond 3 per cycle: its first acquire (5), its last release
#: (4, with the PUBLISH nobody waits for) instead of two handoffs, and a little slack
EDGE_COMMANDS = 10


def _commands_row(view: View) -> list[str]:
    sc = "contended"
    target = (
        "Redis contended cycle: at most 3 server commands (one process; the run's first "
        f"acquire and last release aside, <= {EDGE_COMMANDS} commands per run)"
    )
    counts = _counts(view, _contended.ASYNCLOCK, "cmds_cycle")
    if not counts:
        return [target, "n/a", NOT_RUN]
    parts, within = [], True
    for n, spread in counts:
        cycles = view.spread(sc, _contended.label(_contended.ASYNCLOCK, n), "cycles").median
        parts.append(f"{n} tasks {_s(spread, 3)}")
        if math.isnan(cycles) or spread.high > 3 + EDGE_COMMANDS / cycles:
            within = False
    measured = "commands per cycle: " + "; ".join(parts)
    multi = next((v for v in view.variants(sc, "cmds_cycle") if "asynclock**, " in v), None)
    if multi is not None:
        spread = view.spread(sc, multi, "cmds_cycle")
        measured += f" (3 processes x 6 tasks: {_s(spread, 2)}, their waiters' acquires count)"
    return [target, measured, MET if within else NOT_MET]


def _why_memory(view: View) -> str:
    """This run's split of the memory pair, after the kept reading of why it misses 3x."""
    sc = "memory"
    tail = (
        "Under contention the gap is much smaller (the `memory` section's 16-task row), "
        "because there `asyncio.Lock` suspends too."
    )
    shipped = view.spread(sc, _memory.S_AS_SHIPPED, "us").median
    bare = view.spread(sc, _memory.S_NO_YIELD, "us").median
    state = view.spread(sc, _memory.S_STATE, "us").median
    ideal = view.spread(sc, _memory.S_IDEAL, "us").median
    loop_pass = view.spread(sc, _memory.S_YIELD, "us").median
    if any(math.isnan(x) for x in (shipped, bare, state, ideal, loop_pass)):
        return tail
    return (
        f"Measured (medians, `memory` section): {shipped:.1f} µs per pair = "
        f"{shipped - bare:.1f} µs for the two yields ({(shipped - bare) / shipped:.0%}; one "
        f"bare `await asyncio.sleep(0)` is {loop_pass:.1f} µs) + {bare - state:.1f} µs of "
        f"AsyncLock's layer + {state:.1f} µs in MemoryState's `acquire`/`release`, against "
        f"{ideal:.2f} µs for `asyncio.Lock`. Even with no yield at all it would be "
        f"{bare / ideal:.0f}x, and the State calls alone {state / ideal:.0f}x: the 3x target "
        "is out of reach for a pure-Python lock with owners, tokens and expiry (3x "
        f"`asyncio.Lock` is {3 * ideal:.2f} µs, the cost of a few Python calls), and the "
        "yield rule is kept on purpose. We report the gap instead of chasing it. " + tail
    )


def _table(rows: list[list[str]]) -> list[str]:
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    return lines + [f"| {t} | {m} | {v} |" for t, m, v in rows]


def markdown(view: View) -> str:
    """The block: #6's table and the note on its memory row, then #16's table."""
    rows = [_uncontended_row(view), *_handoff_rows(view), _fairness_row(view)]
    rows += [_throughput_row(view), _memory_row(view), _growth_row(view)]
    rows16 = [*_dispatcher_rows(view), *_anyio_rows(view), *_held_rows(view)]
    rows16 += [*_sql_dispatcher_rows(view), _mysql_handoff_row(view), _commands_row(view)]
    lines = [
        "## Targets",
        "",
        kept("targets-intro"),
        "",
        "### Issue #6",
        "",
        *_table(rows),
        "",
        kept("targets-why-memory"),
        "",
        _why_memory(view),
        "",
        "### Issue #16",
        "",
        kept("targets-goal"),
        "",
        *_table(rows16),
        "",
        kept("targets-why-burst"),
        "",
        _why_burst(view),
    ]
    return "\n".join(lines)


def _why_burst(view: View) -> str:
    """This run's figures beside the kept reading of the burst rows (docs/decisions.md)."""
    sc = "dispatcher"
    dropped = view.spread(sc, _dispatcher.M_CHAT_B, "dropped")
    plain = view.spread(sc, _dispatcher.M_CHAT_B, "x_plain")
    parts = []
    if dropped.count:
        parts.append(f"{fmt(dropped.median, 0)} of the run's events fell out of chat-sdk's queue")
    if plain.count:
        parts.append(f"chat-sdk at {_s(plain, 2)}x the plain baseline")
    return f"This run: {'; '.join(parts)}." if parts else ""
