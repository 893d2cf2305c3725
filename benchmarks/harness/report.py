"""Markdown tables and the ``docs/benchmarks.md`` writer."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from benchmarks.harness.stats import Spread, fmt, fmt_spread

if TYPE_CHECKING:
    from pathlib import Path

Metrics = dict[str, float]


@dataclass
class Rounds:
    """Per-round metrics of every variant, in the order the variants were declared."""

    variants: list[str] = field(default_factory=list)
    data: dict[str, list[Metrics]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    def declare(self, variant: str) -> None:
        if variant not in self.data:
            self.variants.append(variant)
            self.data[variant] = []

    def add(self, variant: str, metrics: Metrics) -> None:
        self.declare(variant)
        self.data[variant].append(metrics)

    def skip(self, variant: str, reason: str) -> None:
        self.declare(variant)
        self.skipped.setdefault(variant, reason)

    def spread(self, variant: str, metric: str) -> Spread:
        return Spread.of(m[metric] for m in self.data.get(variant, []) if metric in m)

    def rounds_of(self, variant: str) -> int:
        return len(self.data.get(variant, []))


@dataclass(frozen=True)
class Column:
    header: str
    metric: str
    digits: int = 0
    median_only: bool = False


# what the running scenario tabulated, for the stored results and the plots (``results``)
_RECORDED: list[Rounds] = []
_RECORDED_DATA: dict[str, Any] = {}


def record_data(name: str, value: Any) -> None:
    """Keep raw numbers of the running scenario that are not in a table (e.g. a curve)."""
    _RECORDED_DATA[name] = value


def take_recorded() -> tuple[list[Rounds], dict[str, Any]]:
    """The Rounds tabulated and the data recorded since the last call; clears both."""
    rounds, data = list(_RECORDED), dict(_RECORDED_DATA)
    _RECORDED.clear()
    _RECORDED_DATA.clear()
    return rounds, data


def table(rounds: Rounds, columns: list[Column], *, label: str = "variant") -> str:
    """A markdown table: one row per variant, each cell ``median (min-max)`` over the rounds."""
    if not any(r is rounds for r in _RECORDED):
        _RECORDED.append(rounds)
    head = "| " + " | ".join([label, *(c.header for c in columns)]) + " |"
    sep = "|" + "---|" * (len(columns) + 1)
    lines = [head, sep]
    for variant in rounds.variants:
        if not rounds.data[variant]:
            reason = rounds.skipped.get(variant, "no data")
            cells = [f"skipped: {reason}"] + [""] * (len(columns) - 1)
        else:
            cells = []
            for col in columns:
                spread = rounds.spread(variant, col.metric)
                if col.median_only:
                    cells.append(fmt(spread.median, col.digits))
                else:
                    cells.append(fmt_spread(spread, col.digits))
        label_cell = variant
        if rounds.data[variant] and variant in rounds.skipped:
            label_cell += f" (then failed: {rounds.skipped[variant]})"
        lines.append("| " + " | ".join([label_cell, *cells]) + " |")
    return "\n".join(lines)


#: the headline value of a metric no round measured
SKIPPED = "n/a (skipped: see the tables)"


class Headlines:
    """A scenario's headline rows ``(what, value)``, in the order they were added.

    ``metric`` reads one variant's spread of one metric; a variant with no rounds gets
    ``missing`` instead of a number, so a skipped peer never shows as a ratio.
    """

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []

    def add(self, what: str, value: str) -> None:
        self.rows.append((what, value))

    def metric(
        self,
        what: str,
        rounds: Rounds,
        variant: str,
        metric: str,
        digits: int,
        *,
        bold: bool = True,
        note: str = "",
        missing: str = SKIPPED,
    ) -> None:
        """``median (min-max)`` of ``metric`` (bold unless told), then ``note``; or ``missing``."""
        spread = rounds.spread(variant, metric)
        if not spread.count:
            self.add(what, missing)
            return
        text = fmt_spread(spread, digits)
        self.add(what, (f"**{text}**" if bold else text) + note)


def violations(rounds: list[Rounds]) -> int:
    """Counter violations plus interval overlaps, over every variant and round of ``rounds``."""
    return sum(
        int(m.get("violations", 0) + m.get("overlaps", 0))
        for r in rounds
        for v in r.variants
        for m in r.data[v]
    )


def kv_table(rows: list[tuple[str, str]], headers: tuple[str, str] = ("what", "value")) -> str:
    lines = [f"| {headers[0]} | {headers[1]} |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines)


@dataclass(frozen=True)
class Section:
    """One scenario's part of the report."""

    scenario: str
    body: str
    headlines: list[tuple[str, str]] = field(default_factory=list)


_DEFAULT_NOTES = (
    "_No notes yet: add the reading of the numbers here; `--write` keeps this block._\n"
)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def _extract(text: str, name: str) -> str | None:
    start, end = _markers(name)
    match = re.search(re.escape(start) + r"\n(.*?)" + re.escape(end), text, flags=re.DOTALL)
    return match.group(1) if match else None


def kept(name: str) -> str:
    """A place for hand-written text inside a scenario's block: the doc holds the text.

    The scenario emits the empty ``text-<name>`` markers where its prose goes; ``fill_kept``
    (``--write`` and the printed report) puts back what the doc has between them, so prose that
    does not depend on the numbers is edited in docs/benchmarks.md, not generated.
    """
    start, end = _markers(f"text-{name}")
    return f"{start}\n{end}"


def doc_text(path: Path) -> str:
    """The doc's text, empty if there is none yet."""
    return path.read_text(encoding="utf-8") if path.exists() else ""


def fill_kept(text: str, doc: str) -> str:
    """``text`` with every empty ``kept`` place filled from ``doc`` (empty if ``doc`` lacks it)."""

    def fill(match: re.Match[str]) -> str:
        start, end = _markers(match.group(1))
        return f"{start}\n{_extract(doc, match.group(1)) or ''}{end}"

    return re.sub(r"<!-- (text-[\w-]+):start -->\n<!-- \1:end -->", fill, text)


def write_doc(
    path: Path,
    *,
    order: list[str],
    preamble: str,
    environment: str | None,
    sections: list[Section],
) -> None:
    """Write ``docs/benchmarks.md``, block by block.

    Every block sits between ``<!-- name:start -->`` and ``<!-- name:end -->`` markers. Blocks of
    scenarios that did not run this time keep their previous text; the hand-written ``notes``
    blocks and the text above the environment block (``preamble`` starts a new doc) are never
    overwritten.
    """
    old = doc_text(path)
    fresh: dict[str, str] = {}
    if environment is not None:  # None: keep the previous environment block
        fresh["environment"] = environment.rstrip() + "\n"
    for section in sections:
        fresh[section.scenario] = fill_kept(section.body.rstrip() + "\n", old)
        if section.headlines:
            heading = f"From `{section.scenario}`:\n\n"
            fresh[f"headlines-{section.scenario}"] = heading + kv_table(section.headlines) + "\n"

    def block(name: str, default: str | None = None) -> str:
        text = fresh.get(name)
        if text is None:
            text = _extract(old, name)
        if text is None:
            text = default
        if text is None:
            return ""
        start, end = _markers(name)
        return f"{start}\n{text}{end}\n"

    notes = _extract(old, "notes") or _DEFAULT_NOTES
    start, end = _markers("notes")
    top = _markers("environment")[0]
    kept = old.split(top)[0].rstrip() if top in old else ""
    parts = [(kept or preamble.rstrip()) + "\n", block("environment"), "## Headline ratios\n"]
    parts += [b for n in order if (b := block(f"headlines-{n}"))]
    parts.append(f"## Reading the numbers\n\n{start}\n{notes}{end}\n")
    # a scenario's hand-written "notes-<scenario>" block (if the doc has one) is kept below it
    parts += [b for n in order for b in (block(n), block(f"notes-{n}")) if b]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
