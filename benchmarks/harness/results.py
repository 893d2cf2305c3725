"""The numbers behind docs/benchmarks.md: raw rounds kept out of git, a compact summary in it.

Every table a scenario prints comes from a :class:`~benchmarks.harness.report.Rounds` (one
metrics dict per variant and round); ``report.table`` records them while the scenario runs, and
with ``--write`` the command line stores them per scenario, next to the scenario's extra data
(the memory-growth curves), in two files:

* ``benchmarks/results/last-run.json``: every round (git ignores ``benchmarks/results/``: a run's
  output, for whoever wants to look at the rounds);
* ``benchmarks/summary/medians.json`` (committed): per scenario, table, variant and metric only
  ``[median, min, max, rounds]``. The targets block and the plots are drawn from it, so running
  one scenario alone redraws them with the other scenarios' stored numbers.

Scenarios that did not run keep their previous entry in both, the same rule as the doc's blocks,
so the summary, the doc and the plots always describe the same runs. NaN is stored as null.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from benchmarks.harness.env import REPO
from benchmarks.harness.stats import Spread

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks.harness.report import Rounds

RESULTS = REPO / "benchmarks" / "results" / "last-run.json"
SUMMARY = REPO / "benchmarks" / "summary" / "medians.json"
FORMAT = 2


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def snapshot(
    rounds: list[Rounds], data: dict[str, Any], *, run: str, started: str, quick: bool
) -> dict[str, Any]:
    """One scenario's raw entry: its tables (every round of every variant) and extra data."""
    tables = [
        {"variants": list(r.variants), "rounds": r.data, "skipped": r.skipped} for r in rounds
    ]
    entry: dict[str, Any] = _clean(
        {"run": run, "started": started, "quick": quick, "tables": tables, "data": data}
    )
    return entry


def _round(value: float) -> float:
    return float(f"{value:.7g}")


def summarize(entry: dict[str, Any]) -> dict[str, Any]:
    """A raw entry reduced to ``[median, min, max, rounds]`` per variant and numeric metric."""
    tables = []
    for tab in entry.get("tables", []):
        spreads: dict[str, dict[str, list[float]]] = {}
        for variant, rounds in tab.get("rounds", {}).items():
            metrics = {m for r in rounds for m, v in r.items() if isinstance(v, (int, float))}
            out = spreads.setdefault(variant, {})
            for metric in sorted(metrics):
                s = Spread.of(float(r[metric]) for r in rounds if r.get(metric) is not None)
                if s.count:
                    out[metric] = [_round(s.median), _round(s.low), _round(s.high), s.count]
        tables.append({"variants": tab.get("variants", []), "spreads": spreads})
    kept = {k: entry.get(k) for k in ("run", "started", "quick")}
    return {**kept, "tables": tables, "data": entry.get("data", {})}


def load(path: Path = SUMMARY) -> dict[str, Any]:
    """A stored file (the summary by default); an empty one if it is missing or of old format."""
    empty = {"format": FORMAT, "environment": {}, "scenarios": {}}
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return empty
    if not isinstance(loaded, dict) or loaded.get("format") != FORMAT:
        return empty
    return loaded


def merge(
    old: dict[str, Any], scenarios: dict[str, dict[str, Any]], environment: list[tuple[str, str]]
) -> dict[str, Any]:
    """``old`` with the entries of the scenarios that ran replaced."""
    merged = {"format": FORMAT, "environment": old.get("environment", {}), "scenarios": {}}
    merged["scenarios"].update(old.get("scenarios", {}))
    merged["scenarios"].update(scenarios)
    if scenarios:
        merged["environment"] = dict(environment)
    return merged


def dump(value: Any, depth: int, pad: str = "") -> str:
    """JSON expanded ``depth`` levels deep, compact below: one line per variant's metrics, so
    the summary stays small and reads well in a diff."""
    compact = depth == 0 or not isinstance(value, (dict, list)) or not value
    if compact:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    inner = pad + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {dump(v, depth - 1, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    items = [inner + dump(v, depth - 1, inner) for v in value]
    return "[\n" + ",\n".join(items) + f"\n{pad}]"


def save(
    snapshots: dict[str, dict[str, Any]], environment: list[tuple[str, str]]
) -> dict[str, Any]:
    """Store a run's raw entries and their summary; the merged summary."""
    raw = merge(load(RESULTS), snapshots, environment)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(raw, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    summary = merge(load(), {k: summarize(v) for k, v in snapshots.items()}, environment)
    SUMMARY.write_text(dump(summary, 6) + "\n", encoding="utf-8")
    return summary


class View:
    """Read access to the summary by scenario, variant label and metric."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results

    def scenario(self, name: str) -> dict[str, Any] | None:
        entry = self.results.get("scenarios", {}).get(name)
        return entry if isinstance(entry, dict) else None

    def spread(self, scenario: str, variant: str, metric: str) -> Spread:
        """``metric`` of ``variant`` over the rounds (the first table that has it)."""
        entry = self.scenario(scenario)
        for tab in entry.get("tables", []) if entry else []:
            found = tab.get("spreads", {}).get(variant, {}).get(metric)
            if found:
                median, low, high, count = found
                nan = math.nan
                return Spread(
                    nan if median is None else median,
                    nan if low is None else low,
                    nan if high is None else high,
                    int(count),
                )
        return Spread.of([])

    def variants(self, scenario: str, metric: str) -> list[str]:
        """Variants, in table order, that have ``metric`` in some round."""
        entry = self.scenario(scenario)
        out: list[str] = []
        for tab in entry.get("tables", []) if entry else []:
            spreads = tab.get("spreads", {})
            for variant in tab.get("variants", []):
                if metric in spreads.get(variant, {}) and variant not in out:
                    out.append(variant)
        return out

    def data(self, scenario: str, name: str) -> Any:
        entry = self.scenario(scenario)
        return entry.get("data", {}).get(name) if entry else None

    def started(self, scenario: str) -> str:
        entry = self.scenario(scenario)
        if not entry:
            return "not run"
        quick = " (--quick)" if entry.get("quick") else ""
        return f"{entry.get('started', '?')}, run {entry.get('run', '?')}{quick}"
