"""PNG charts of the stored summary (``benchmarks/summary/``) into ``docs/img/``.

matplotlib with the Agg backend (no display needed). Every chart shows the median over the
rounds with a min-max whisker, so a chart says what the tables say. A chart whose scenario has
no stored results is skipped and says so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from benchmarks.harness.env import REPO, log
from benchmarks.harness.report import kept
from benchmarks.scenarios import contended as _contended
from benchmarks.scenarios import dedupe as _dedupe
from benchmarks.scenarios import inbox_scale as _inbox_scale
from benchmarks.scenarios import memory_growth as _growth
from benchmarks.scenarios import uncontended as _uncontended

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from benchmarks.harness.results import View

IMG = REPO / "docs" / "img"
ASYNCLOCK_COLOR = "#d62728"
PEER_COLOR = "#7f7f7f"
FLOOR_COLOR = "#1f77b4"
IDEAL_COLOR = "#2ca02c"


def _name(label: str) -> str:
    return label.replace("**", "").replace("`", "")


def _color(label: str) -> str:
    if "asynclock" in label:
        return ASYNCLOCK_COLOR
    if label.startswith("floor") or "raw floor" in label:
        return FLOOR_COLOR
    if "asyncio.Lock" in label or label.startswith("plain"):
        return IDEAL_COLOR
    return PEER_COLOR


def _whiskers(view: View, scenario: str, variants: list[str], metric: str) -> Any:
    meds, lows, highs = [], [], []
    for v in variants:
        s = view.spread(scenario, v, metric)
        meds.append(s.median)
        lows.append(s.median - s.low)
        highs.append(s.high - s.median)
    return meds, [lows, highs]


def _wrap(text: str, width: int = 38) -> str:
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    lines.append(line)
    return "\n".join(lines)


def _barh(
    ax: Any,
    view: View,
    scenario: str,
    variants: list[str],
    metric: str,
    *,
    digits: int = 0,
    log_scale: bool = False,
) -> None:
    meds, err = _whiskers(view, scenario, variants, metric)
    ys = list(range(len(variants)))[::-1]
    colors = [_color(_name(v)) for v in variants]
    ax.barh(ys, meds, xerr=err, color=colors, capsize=3, ecolor="black", height=0.6)
    ax.set_yticks(ys, [_wrap(_name(v)) for v in variants], fontsize=8)
    if log_scale:
        ax.set_xscale("log")
    top = max((m + e for m, e in zip(meds, err[1], strict=True) if not math.isnan(m)), default=1.0)
    for y, m, e in zip(ys, meds, err[1], strict=True):
        if not math.isnan(m):
            x = (m + e) * 1.04 if log_scale else m + e
            ax.text(x, y, f" {m:,.{digits}f}", va="center", fontsize=8)
    if not log_scale:
        ax.set_xlim(0, top * 1.18)
    ax.grid(axis="x", alpha=0.3)


def _subtitle(view: View, scenario: str) -> str:
    return f"{scenario}: {view.started(scenario)}"


def _bar_chart(
    view: View, plt: Any, sc: str, metric: str, per_row: float, labels: tuple[str, str], log: bool
) -> Any:
    """One bar per variant of ``sc`` that has ``metric``; ``labels``: the x axis's, the title."""
    variants = view.variants(sc, metric)
    if not variants:
        return None
    fig, ax = plt.subplots(figsize=(9, per_row * len(variants) + 1.6))
    _barh(ax, view, sc, variants, metric, log_scale=log)
    ax.set_xlabel(labels[0])
    ax.set_title(labels[1], fontsize=11)
    fig.text(0.01, 0.01, _subtitle(view, sc), fontsize=7, color="gray")
    return fig


def _draw_uncontended(view: View, plt: Any) -> Any:
    ratio = view.spread("uncontended", _uncontended.ASYNCLOCK, "x_redispy")
    title = "Uncontended lock throughput"
    if ratio.count:
        title += f"\nasynclock ÷ redis-py Lock: {ratio.median:.2f}x (median of per-round ratios; "
        title += "target >= 1.2x)"
    xlabel = "acquire+release pairs/s, 1 task, one key (median, whisker min-max)"
    return _bar_chart(view, plt, "uncontended", "pairs_s", 0.65, (xlabel, title), log=False)


def _draw_handoff(view: View, plt: Any) -> Any:
    sc = "contended"
    multi = view.variants(sc, "xg_p50")
    at16 = _at_16()
    rows = [(v, _name(v), "xh_p50", "xh_p99") for v in view.variants(sc, "xh_p50") if v in at16]
    rows += [(v, _name(v) + " (cross-process)", "xg_p50", "xg_p99") for v in multi]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.75 * len(rows) + 1.8))
    ys = list(range(len(rows)))[::-1]
    for offset, idx, shade in ((0.18, 2, 1.0), (-0.18, 3, 0.45)):
        meds, lows, highs = [], [], []
        for variant, _, p50, p99 in rows:
            s = view.spread(sc, variant, p50 if idx == 2 else p99)
            meds.append(s.median)
            lows.append(s.median - s.low)
            highs.append(s.high - s.median)
        colors = [_color(_name(r[0])) for r in rows]
        ax.barh(
            [y + offset for y in ys],
            meds,
            xerr=[lows, highs],
            height=0.34,
            color=colors,
            alpha=shade,
            capsize=2,
            ecolor="black",
            label="p50" if idx == 2 else "p99",
        )
        for y, m, e in zip(ys, meds, highs, strict=True):
            if not math.isnan(m):
                ax.text((m + e) * 1.1, y + offset, f"{m:.3g}", va="center", fontsize=7)
    ax.set_xscale("log")
    ax.axvline(0.5, color="black", linestyle="--", linewidth=1)
    ax.text(0.5, ys[0] + 0.55, " target p50 < 0.5 ms", fontsize=8)
    ax.set_yticks(ys, [_wrap(r[1]) for r in rows], fontsize=8)
    ax.set_xlabel("handoff ms, log scale (solid bar p50, light bar p99; whisker min-max)")
    ax.set_title("Contended cross-worker handoff p50 / p99, 16 tasks x 100 cycles", fontsize=11)
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.text(0.01, 0.01, _subtitle(view, sc), fontsize=7, color="gray")
    return fig


def _draw_fairness(view: View, plt: Any) -> Any:
    sc = "contended"
    multi_rows = set(view.variants(sc, "xg_p50"))
    at16 = _at_16()
    variants = [v for v in view.variants(sc, "streak") if v in at16 or v in multi_rows]
    if not variants:
        return None
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11, 0.6 * len(variants) + 1.8), sharey=True, width_ratios=[3, 2]
    )
    _barh(left, view, sc, variants, "streak")
    left.axvline(1, color="black", linestyle="--", linewidth=1)
    left.set_xlabel("longest same-worker streak (1 = FIFO handoff; lower is fairer)")
    # per-worker counts only for the single-process rows (the tables show them only there)
    multi = set(view.variants(sc, "xg_p50"))
    small = [v for v in variants if view.spread(sc, v, "fair_min").count and v not in multi]
    meds, err = _whiskers(view, sc, small, "fair_min")
    ys = [len(variants) - 1 - variants.index(v) for v in small]
    right.barh(ys, meds, xerr=err, color=[_color(_name(v)) for v in small], capsize=3, height=0.6)
    for y, m, e in zip(ys, meds, err[1], strict=True):
        right.text(m + e, y, f" {m:.0f}", va="center", fontsize=8)
    right.set_xlim(0, 115)
    right.set_xlabel("min acquisitions per worker (of 100)*")
    right.grid(axis="x", alpha=0.3)
    fig.suptitle("Fairness under contention (16 tasks; 3 processes x 6 tasks)", fontsize=11)
    fig.text(
        0.99,
        0.01,
        "* counted until the first worker finished its 100 cycles; single-process rows only",
        fontsize=7,
        color="gray",
        ha="right",
    )
    fig.text(0.01, 0.01, _subtitle(view, sc), fontsize=7, color="gray")
    return fig


def _at_16() -> set[str]:
    """The contended rows at the 16-task count (the per-variant charts show only those)."""
    return {_contended.label(b, _contended.WORKERS) for b in _contended.BASES}


_SWEEP_STYLE = {
    _contended.IDEAL: (IDEAL_COLOR, "-", "o"),
    _contended.ASYNCLOCK: (ASYNCLOCK_COLOR, "-", "o"),
    _contended.REDISPY: ("#555555", "--", "s"),
    _contended.REDISPY_FAST: ("#8c564b", "-.", "^"),
    _contended.PRL: ("#9467bd", ":", "D"),
}


def _draw_sweep(view: View, plt: Any) -> Any:
    sc = "contended"
    have = set(view.variants(sc, "cycles_s"))
    if not any(_contended.label(b, n) in have for b in _contended.BASES for n in (4, 64)):
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    counts = list(_contended.TASK_COUNTS)
    for base in _contended.BASES:
        color, dash, marker = _SWEEP_STYLE[base]
        for ax, metric in ((left, "xh_p50"), (right, "cycles_s")):
            xs, meds, lows, highs = [], [], [], []
            for n in counts:
                spread = view.spread(sc, _contended.label(base, n), metric)
                if spread.count:
                    xs.append(n)
                    meds.append(spread.median)
                    lows.append(spread.median - spread.low)
                    highs.append(spread.high - spread.median)
            if xs:
                ax.errorbar(
                    xs,
                    meds,
                    yerr=[lows, highs],
                    color=color,
                    linestyle=dash,
                    marker=marker,
                    capsize=3,
                    label=_name(base),
                )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("tasks on one key (threads for python-redis-lock)")
        ax.grid(alpha=0.3, which="both")
    left.axhline(0.5, color="black", linestyle="--", linewidth=1)
    left.text(counts[0], 0.55, "target p50 < 0.5 ms", fontsize=8)
    left.set_ylabel("cross-worker handoff p50, ms (log scale)")
    left.set_title("Handoff p50 vs task count", fontsize=11)
    right.set_ylabel("cycles/s (log scale)")
    right.set_title("Throughput vs task count", fontsize=11)
    right.legend(fontsize=7, loc="best")
    shape = ", ".join(f"{n} x {int(_cycles(view, n))}" for n in counts)
    fig.suptitle(f"Contended sweep, one key (tasks x cycles per task: {shape})", fontsize=11)
    fig.text(0.01, 0.01, _subtitle(view, sc) + "; median, whisker min-max", fontsize=7,
             color="gray")  # fmt: skip
    return fig


def _cycles(view: View, n: int) -> float:
    """Cycles per task at ``n`` tasks in the stored run (from the asyncio.Lock rows)."""
    total = view.spread("contended", _contended.label(_contended.IDEAL, n), "cycles").median
    return total / n if not math.isnan(total) else float(_contended.CYCLES[n])


def _draw_dispatch(view: View, plt: Any) -> Any:
    sc = "dispatcher"
    variants = view.variants(sc, "events_s")
    if not variants:
        return None
    mem = [v for v in variants if "Memory" in v or v.startswith("plain")]
    red = [v for v in variants if v not in mem]
    fig, axes = plt.subplots(
        2, 1, figsize=(9, 0.55 * len(variants) + 2.6), height_ratios=[len(mem), len(red)]
    )
    for ax, group, title in ((axes[0], mem, "in memory"), (axes[1], red, "on Redis")):
        _barh(ax, view, sc, group, "events_s", log_scale=True)
        ax.set_title(f"EventDispatcher events/s {title} (log scale)", fontsize=10)
    axes[1].set_xlabel("events/s, 4,000 events over 50 keys (median, whisker min-max)")
    fig.text(0.01, 0.005, _subtitle(view, sc), fontsize=7, color="gray")
    return fig


def _draw_growth_curve(view: View, plt: Any) -> Any:
    sc = "memory-growth"
    curves = view.data(sc, "curves") or {}
    if not curves:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    styles = {_growth.SHORT: (ASYNCLOCK_COLOR, "-"), _growth.CONTROL: (PEER_COLOR, "--")}
    for name, curve in curves.items():
        color, dash = styles.get(name, ("black", ":"))
        samples = curve["samples"]
        keys = [row[0] / 1000 for row in samples]
        top.plot(keys, [row[1] for row in samples], dash, color=color, label=name)
        entries = [(row[2] + row[3]) / 1000 for row in samples]
        bottom.plot(keys, entries, dash, color=color, label=name)
        sweep = curve.get("sweep") or []
        if sweep and name == _growth.SHORT:
            left = (sweep[-1][1] + sweep[-1][2]) / 1000
            bottom.annotate(
                f"after TTL + {sweep[-1][0]:,.0f} more ops: {sweep[-1][1] + sweep[-1][2]:,.0f} left",
                xy=(keys[-1], left),
                xytext=(keys[-1] * 0.45, max(entries) * 0.55 + 1),
                arrowprops={"arrowstyle": "->"},
                fontsize=8,
            )
            bottom.plot([keys[-1]], [left], "o", color=color)
    top.set_ylabel("RSS MiB")
    top.set_title(
        "MemoryState memory over distinct keys (one fresh process per curve)", fontsize=11
    )
    top.legend(fontsize=8)
    top.grid(alpha=0.3)
    bottom.set_ylabel("entries held (thousands)")
    bottom.set_xlabel("distinct keys processed (thousands): lock pair + first_seen per key")
    bottom.grid(alpha=0.3)
    fig.text(0.01, 0.005, _subtitle(view, sc), fontsize=7, color="gray")
    return fig


def _draw_dedupe_rates(view: View, plt: Any) -> Any:
    ratio = view.spread("dedupe", f"{_dedupe.REDIS}, {_dedupe.NEW}", "x_floor")
    title = "Deduper checks/s"
    if ratio.count:
        title += f" (Redis, new ids: {ratio.median:.2f}x the SET NX PX floor)"
    xlabel = "first_seen checks/s, one task (log scale; median, whisker min-max)"
    return _bar_chart(view, plt, "dedupe", "checks_s", 0.5, (xlabel, title), log=True)


_SCALE_COLOR = {
    "redis": "#d62728",
    "redis-cluster": "#ff7f0e",
    "postgres": "#1f77b4",
    "mysql": "#2ca02c",
    "procrastinate": PEER_COLOR,
    "streams": "#000000",
}


def _draw_inbox_scale(view: View, plt: Any) -> Any:
    """Per-event server work and events/s against workers, trickle and backlog, from the runs
    stored by ``inbox-scale --write`` (its own file): the newest run solid, the one before it
    dashed."""
    runs = _inbox_scale.stored()
    if not runs:
        return None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    for age, run in enumerate(reversed(runs[-2:])):
        style = "-" if age == 0 else "--"
        cells = _inbox_scale.cells_of(run)
        for series in _inbox_scale.SERIES:
            for row, mode in enumerate(("trickle", "backlog")):
                mine = sorted(
                    (c for c in cells if c.series == series and c.mode == mode),
                    key=lambda c: c.workers,
                )
                if not mine:
                    continue
                xs = [c.workers for c in mine]
                label = f"{_name(_inbox_scale.LABEL[series])} ({run['asynclock']})"
                for col, values in enumerate(([c.cost for c in mine], [c.events_s for c in mine])):
                    axes[row][col].plot(
                        xs, values, style, marker="o", color=_SCALE_COLOR[series], label=label
                    )
    for row, mode in enumerate(("trickle", "backlog")):
        for col, what in enumerate(("server work per event", "events/s")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xticks(_inbox_scale.WORKERS, [str(w) for w in _inbox_scale.WORKERS])
            ax.set_xlabel("worker processes")
            ax.set_ylabel(what + (" (log scale)" if col == 0 else ""))
            if col == 0:
                ax.set_yscale("log")
            ax.set_title(f"{mode}: {what}", fontsize=10)
            ax.grid(alpha=0.3, which="both")
    axes[0][1].legend(fontsize=6, loc="best")
    fig.suptitle(
        "Durable inbox against worker processes (Redis: requests, PostgreSQL: transactions, "
        "MariaDB: statements; solid: newest run, dashed: the one before)",
        fontsize=10,
    )
    return fig


CHARTS: dict[str, tuple[str, Callable[[View, Any], Any]]] = {
    "uncontended.png": ("Uncontended pairs/s per variant", _draw_uncontended),
    "contended-handoff.png": ("Contended handoff p50/p99 per variant (log scale)", _draw_handoff),
    "contended-sweep.png": (
        "Contended sweep: handoff p50 and throughput vs task count",
        _draw_sweep,
    ),
    "fairness.png": ("Fairness: longest same-worker streak, min acquisitions", _draw_fairness),
    "dispatcher.png": ("Dispatcher events/s", _draw_dispatch),
    "memory-growth.png": ("MemoryState memory growth over distinct keys", _draw_growth_curve),
    "dedupe.png": ("Deduper checks/s", _draw_dedupe_rates),
    "inbox-scale.png": (
        "Durable inbox: server work per event and events/s against workers",
        _draw_inbox_scale,
    ),
}


def render(view: View, out: Path = IMG) -> list[tuple[str, str]]:
    """Write every chart that has data; returns (file name, caption) of those written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written: list[tuple[str, str]] = []
    for filename, (caption, draw) in CHARTS.items():
        try:
            fig = draw(view, plt)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            log(f"plots: {filename} failed: {exc!r}")
            continue
        if fig is None:
            log(f"plots: {filename} skipped (no stored results)")
            continue
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        fig.savefig(out / filename, dpi=110)
        plt.close(fig)
        written.append((filename, caption))
        log(f"plots: wrote {out / filename}")
    return written


def markdown(written: list[tuple[str, str]]) -> str:
    """The ``plots`` block of docs/benchmarks.md."""
    lines = [
        "## Plots",
        "",
        kept("plots-intro"),
        "",
    ]
    for filename, caption in written:
        lines += [f"![{caption}](img/{filename})", ""]
    return "\n".join(lines)
