"""The raw numbers behind docs/benchmarks.md: ``benchmarks/results/last-run.json``.

Every table a scenario prints comes from a :class:`~benchmarks._report.Rounds` (one metrics
dict per variant and round); ``_report.table`` records them while the scenario runs, and the
command line stores them here per scenario with ``--write``, next to the scenario's extra data
(the memory-growth curves). Scenarios that did not run keep their previous entry, the same rule
as the doc's blocks, so the JSON, the doc and the plots (``_plots``) always describe the same
runs. NaN is stored as null.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from benchmarks._env import REPO
from benchmarks._stats import Spread

if TYPE_CHECKING:
    from pathlib import Path

    from benchmarks._report import Rounds

RESULTS = REPO / "benchmarks" / "results" / "last-run.json"
FORMAT = 1


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
    """One scenario's entry: its tables (every round of every variant) and extra data."""
    tables = [
        {"variants": list(r.variants), "rounds": r.data, "skipped": r.skipped} for r in rounds
    ]
    entry: dict[str, Any] = _clean(
        {"run": run, "started": started, "quick": quick, "tables": tables, "data": data}
    )
    return entry


def load(path: Path = RESULTS) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {"format": FORMAT, "environment": [], "scenarios": {}}
    if not isinstance(loaded, dict) or loaded.get("format") != FORMAT:
        return {"format": FORMAT, "environment": [], "scenarios": {}}
    return loaded


def merge(
    old: dict[str, Any], scenarios: dict[str, dict[str, Any]], environment: list[tuple[str, str]]
) -> dict[str, Any]:
    """``old`` with the entries of the scenarios that ran replaced."""
    merged = {"format": FORMAT, "environment": old.get("environment", []), "scenarios": {}}
    merged["scenarios"].update(old.get("scenarios", {}))
    merged["scenarios"].update(scenarios)
    if scenarios:
        merged["environment"] = [list(kv) for kv in environment]
    return merged


def save(results: dict[str, Any], path: Path = RESULTS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


class View:
    """Read access to the stored results by scenario, variant label and metric."""

    def __init__(self, results: dict[str, Any]) -> None:
        self.results = results

    def scenario(self, name: str) -> dict[str, Any] | None:
        entry = self.results.get("scenarios", {}).get(name)
        return entry if isinstance(entry, dict) else None

    def values(self, scenario: str, variant: str, metric: str) -> list[float]:
        """Every round's value of ``metric`` for ``variant`` (the first table that has it)."""
        entry = self.scenario(scenario)
        if entry is None:
            return []
        for tab in entry.get("tables", []):
            rounds = tab.get("rounds", {}).get(variant)
            if not rounds:
                continue
            found = [m[metric] for m in rounds if m.get(metric) is not None]
            if found:
                return [float(v) for v in found]
        return []

    def spread(self, scenario: str, variant: str, metric: str) -> Spread:
        return Spread.of(self.values(scenario, variant, metric))

    def variants(self, scenario: str, metric: str) -> list[str]:
        """Variants, in table order, that have ``metric`` in some round."""
        entry = self.scenario(scenario)
        out: list[str] = []
        for tab in entry.get("tables", []) if entry else []:
            for variant in tab.get("variants", []):
                rounds = tab.get("rounds", {}).get(variant) or []
                has = any(m.get(metric) is not None for m in rounds)
                if has and variant not in out:
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
