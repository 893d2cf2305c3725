"""The command line's composition: which scenarios exist, in the doc's order, and the views.

``asynclock bench`` recognises a source checkout by this file. The harness
(``benchmarks/harness/``) knows no scenario; the scenarios (``benchmarks/scenarios/``) know only
the harness; the views (``benchmarks/views/``: the targets table and the plots) read what the
scenarios stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from benchmarks.harness import cli
from benchmarks.harness.report import Section
from benchmarks.scenarios import (
    aiogram,
    cluster,
    contended,
    dashboard,
    dedupe,
    dispatcher,
    held,
    inbox,
    inbox_growth,
    inbox_scale,
    inbox_sql,
    memory,
    memory_growth,
    semaphore,
    sql,
    sql_dispatcher,
    supersede,
    uncontended,
)
from benchmarks.views import plots, targets

if TYPE_CHECKING:
    from benchmarks.harness.results import View

MODULES = (
    uncontended,
    contended,
    memory,
    dispatcher,
    sql,
    sql_dispatcher,
    memory_growth,
    dedupe,
    cluster,
    inbox,
    inbox_sql,
    inbox_growth,
    held,
    inbox_scale,
    semaphore,
    supersede,
    dashboard,
    aiogram,
)


def views(view: View, draw: bool) -> list[Section]:
    """The targets block and, with ``draw``, the plots (PNGs written to docs/img/)."""
    extra = [Section("targets", targets.markdown(view))]
    if draw:
        extra.append(Section("plots", plots.markdown(plots.render(view))))
    return extra


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks``."""
    return cli.main([m.SCENARIO for m in MODULES], views, argv)
