"""The interleaved rounds every scenario runs: variants round-robin, failures dropped and logged.

Each round runs every live variant once, starting one variant further than the round before, so
that no variant always runs first (on a cold cache) or last (after the others warmed the server).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from benchmarks.harness.contend import Outcome, analyze
from benchmarks.harness.env import log, short
from benchmarks.harness.scenario import Variant

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from benchmarks.harness.env import CommandCounter
    from benchmarks.harness.report import Metrics, Rounds

T = TypeVar("T")
V = TypeVar("V", bound=Variant)

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


@dataclass(frozen=True)
class Timed:
    """The metric names ``interleave`` stores a timed loop under (scenarios keep their own)."""

    rate: str = "rate"  # operations a second
    us: str = "us"  # wall µs per operation
    cpu_us: str = "cpu_us"  # this process's CPU µs per operation
    commands: str = "cmds"  # server commands per operation (with a counter)
    #: also store ``t_<tag>``: the time ratio to each reference, not only the rate ratio
    time_ratios: bool = False


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


async def teardown(variant: Variant, scenario: str) -> None:
    """``variant.teardown()``; a failure is logged, never raised."""
    try:
        await variant.teardown()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"{scenario}: teardown of {variant.name} failed: {exc!r}")


async def set_up(
    variants: list[V],
    rows_of: Callable[[V], Rounds],
    scenario: str,
    warm: Callable[[int, V], Awaitable[None]],
) -> list[V]:
    """Declare every variant in its table, set it up and ``warm(index, variant)`` it; the ones
    that work (a failing one is skipped in its table with the first line of why)."""
    live: list[V] = []
    for index, variant in enumerate(variants):
        rows_of(variant).declare(variant.name)
        try:
            await variant.setup()
            await warm(index, variant)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            rows_of(variant).skip(variant.name, _first_line(exc))
            log(f"{scenario}: {short(variant.name)} skipped: {exc!r}")
            await teardown(variant, scenario)
        else:
            live.append(variant)
    return live


async def interleave(
    variants: list[V],
    rounds: Rounds,
    *,
    n: int,
    rounds_n: int,
    scenario: str,
    warmup: int,
    names: Timed = Timed(),
    counter: CommandCounter | None = None,
    label: Callable[[str], str] = short,
) -> None:
    """Time ``loop(n)`` of every variant once a round, round-robin, for ``rounds_n`` rounds.

    Each variant is set up and warmed once and torn down at the end; one that fails is dropped
    (skipped in ``rounds``) and not run again. Within a round each variant is divided by its
    ``refs`` (tag -> variant name): ``x_<tag>`` is the rate ratio.
    """

    async def warm(_: int, variant: V) -> None:
        if warmup:
            await variant.loop(warmup)

    live = await set_up(variants, lambda _: rounds, scenario, warm)
    try:
        for r in range(rounds_n):
            per_round: dict[str, Metrics] = {}
            for variant in rotated(live, r):
                try:
                    await variant.before_round()
                    gc.collect()
                    if counter is not None:
                        await counter.start()
                    t0, c0 = time.perf_counter(), time.process_time()
                    await variant.loop(n)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    commands = await counter.stop() if counter is not None else None
                    await variant.after_round()
                except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                    rounds.skip(variant.name, _first_line(exc))
                    log(f"{scenario}: {variant.name} failed, dropped: {exc!r}")
                    live.remove(variant)  # a variant that failed once is not run again
                    await teardown(variant, scenario)
                    continue
                metrics = {names.rate: n / wall, names.us: wall / n * 1e6}
                metrics[names.cpu_us] = cpu / n * 1e6
                if commands is not None:
                    metrics[names.commands] = commands / n
                per_round[variant.name] = metrics
            for variant in live:
                metrics = per_round.get(variant.name, {})
                for tag, ref in variant.refs.items() if metrics else ():
                    if ref in per_round:
                        metrics[f"x_{tag}"] = metrics[names.rate] / per_round[ref][names.rate]
                        if names.time_ratios:
                            metrics[f"t_{tag}"] = metrics[names.us] / per_round[ref][names.us]
                if metrics:
                    rounds.add(variant.name, metrics)
            done = ", ".join(f"{label(k)}: {m[names.rate]:,.0f}/s" for k, m in per_round.items())
            log(f"{scenario} round {r + 1}/{rounds_n}: {done}")
    finally:
        for variant in live:
            await teardown(variant, scenario)
