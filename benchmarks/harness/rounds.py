"""The interleaved rounds every scenario runs: variants round-robin, failures dropped and logged.

Each round runs every live variant once, starting one variant further than the round before, so
that no variant always runs first (on a cold cache) or last (after the others warmed the server).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from benchmarks.harness.contend import Outcome, analyze
from benchmarks.harness.env import log

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from benchmarks.harness.report import Metrics, Rounds

T = TypeVar("T")

#: one timed contended run: the merged cycles (None on failure), the server commands it took
#: (None where nobody counts them) and why it failed
ContentionRun = tuple[Outcome | None, int | None, str | None]


def rotated(items: list[T], r: int) -> list[T]:
    """``items`` in round ``r``'s order: starting at ``r % len(items)``, wrapping around."""
    shift = r % len(items) if items else 0
    return items[shift:] + items[:shift]


async def close_all(closers: list[Callable[[], Awaitable[None]]], scenario: str) -> None:
    """Await every closer in order; a failing one is logged and the rest still run."""
    for close in closers:
        try:
            await close()
        except Exception as exc:  # noqa: BLE001, PERF203 (reported, never fatal)
            log(f"{scenario}: close failed: {exc!r}")


@dataclass(frozen=True)
class ContentionRow:
    """One contended variant: how to run it once, the table it lands in, its worker count."""

    run: Callable[[], Awaitable[ContentionRun]]
    target: Rounds
    workers: int


async def contention_rounds(
    rows: dict[str, ContentionRow],
    *,
    rounds_n: int,
    timeout: float,
    scenario: str,
    tag: Callable[[str], str],
    ratios: Callable[[dict[str, Metrics]], None] | None = None,
) -> None:
    """Run every row once a round for ``rounds_n`` rounds, analysed into its target ``Rounds``.

    A row that fails or times out once is skipped in its table (the first line of why) and not
    run again. Where a run counted the server's commands, ``cmds_cycle`` is that per cycle.
    ``ratios`` sees each round's metrics by row to add the within-round ratios; ``tag`` names a
    row in the progress line.
    """
    names = list(rows)
    for r in range(rounds_n):
        if not names:
            break
        per_round: dict[str, Metrics] = {}
        for name in rotated(names, r):
            row = rows[name]
            gc.collect()
            try:
                outcome, commands, error = await row.run()
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                outcome, commands, error = None, None, f"{type(exc).__name__}: {exc}"
            if outcome is None or outcome.timed_out:
                reason = error or f"timed out after {timeout:.0f} s"
                row.target.skip(name, reason.splitlines()[0] if reason else "failed")
                log(f"{scenario}: {name} round {r + 1} failed, dropped: {reason}")
                names.remove(name)  # a variant that failed once is not run again
                continue
            metrics = analyze(
                outcome.events,
                workers=row.workers,
                started=outcome.started,
                counter_violations=outcome.counter_violations,
            )
            if commands is not None:
                metrics["cmds_cycle"] = commands / max(1.0, metrics.get("cycles", 1.0))
            per_round[name] = metrics
            row.target.add(name, metrics)
        if ratios is not None:
            ratios(per_round)
        summary = ", ".join(f"{tag(k)}: {m['cycles_s']:,.0f}/s" for k, m in per_round.items())
        log(f"{scenario} round {r + 1}/{rounds_n}: {summary}")
