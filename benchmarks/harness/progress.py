"""Progress on stderr for long runs: a rich status bar on a terminal, plain lines elsewhere.

stdout stays the markdown report. When stderr is a TTY (and ``rich`` is installed) the run shows
one bar over the scenarios with the elapsed time, plus a bar for the step inside a scenario that
reports its own progress (the memory-growth children, the dedupe rounds); the log lines of
:func:`benchmarks.harness.env.log` are printed above the bars. When stderr is not a TTY (CI, a pipe,
``2> file``) nothing changes: the same log lines, one per line, no escape codes.
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from benchmarks.harness import env as _env

if TYPE_CHECKING:
    from collections.abc import Iterator


class Step:
    """One bar inside a scenario; plain mode logs at most every 25% (and at the end)."""

    def __init__(self, bars: Any, description: str, total: float) -> None:
        self._bars = bars
        self._description = description
        self._total = max(total, 1.0)
        self._done = 0.0
        self._next_log = 0.25
        self._t0 = time.monotonic()
        self._task = bars.add_task(description, total=total) if bars is not None else None

    def update(self, completed: float) -> None:
        self._done = completed
        if self._bars is not None:
            self._bars.update(self._task, completed=completed)
            return
        share = completed / self._total
        if share >= self._next_log and share < 1.0:
            _env.log(f"  {self._description}: {share:.0%} ({time.monotonic() - self._t0:.0f} s)")
            while self._next_log <= share:
                self._next_log += 0.25

    def advance(self, amount: float = 1.0) -> None:
        self.update(self._done + amount)

    def close(self) -> None:
        if self._bars is not None:
            self._bars.remove_task(self._task)


class _Display:
    def __init__(self) -> None:
        self.bars: Any = None
        self.overall: Any = None


_DISPLAY = _Display()


def fancy() -> bool:
    """Whether the rich display is used: stderr is a terminal and rich is importable."""
    if not sys.stderr.isatty():
        return False
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


@contextmanager
def run_display(scenarios: int) -> Iterator[None]:
    """The whole run's display: a bar over ``scenarios`` with the elapsed time."""
    if not fancy():
        yield
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True, highlight=False)
    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    _DISPLAY.bars = bars
    _DISPLAY.overall = bars.add_task("benchmarks", total=scenarios)

    def sink(message: str) -> None:
        console.print(message, markup=False, highlight=False)

    _env.set_log_sink(sink)
    try:
        with bars:
            yield
    finally:
        _env.set_log_sink(None)
        _DISPLAY.bars = None
        _DISPLAY.overall = None


def scenario(name: str, index: int) -> None:
    """The overall bar now shows scenario ``name`` with ``index`` scenarios done before it."""
    if _DISPLAY.bars is not None:
        _DISPLAY.bars.update(_DISPLAY.overall, description=f"scenario {name}", completed=index)


def finished(count: int) -> None:
    if _DISPLAY.bars is not None:
        _DISPLAY.bars.update(_DISPLAY.overall, description="done", completed=count)


@contextmanager
def step(description: str, total: float) -> Iterator[Step]:
    """A bar for one long step of a scenario (``total`` units of work)."""
    current = Step(_DISPLAY.bars, description, total)
    try:
        yield current
    finally:
        current.close()
