"""Scenario ``memory-growth``: MemoryState's RSS over a million distinct keys.

Each measurement runs in a fresh child process (``python -m benchmarks.scenarios.memory_growth
PARAMS``), so its peak RSS (VmHWM) is its own; what a child does per key, and the control child
whose TTL never expires: docs/benchmarks.md, the ``memory-growth`` block.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import progress as _progress
from benchmarks.harness.env import REPO, Asynclock, Config, log, now_utc
from benchmarks.harness.report import Column, Rounds, Section, kept, record_data, table
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.stats import fmt, fmt_spread

SAMPLES = 50
SHORT = "short TTL: dedupe ids and stale locks expire during the run"
CONTROL = "control: TTL 600 s, nothing expires during the run"


@dataclass(frozen=True)
class Params:
    keys: int
    ttl: float
    wait: bool
    sweep_ops: int


def _status_kib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return float("nan")


def rss_mib() -> float:
    return _status_kib("VmRSS") / 1024


def peak_mib() -> float:
    return _status_kib("VmHWM") / 1024


def _progress_line(done: int, total: int) -> None:
    print(f"progress {done} {total}", file=sys.stderr, flush=True)


async def _child(p: Params) -> dict[str, Any]:
    import asynclock  # the child's only import of the library

    state = asynclock.MemoryState()
    dedupe = asynclock.Deduper(state, ttl=p.ttl, namespace="growth")
    lock_cls = asynclock.AsyncLock
    for _ in range(1000):  # warm the code paths on one key before the baseline
        lock = lock_cls(state, "warm", ttl=30.0)
        await lock.acquire()
        await lock.release()
        await dedupe.first_seen("warm")
    gc.collect()
    before = rss_mib()
    samples: list[list[float]] = [[0, before, 0, 0, 0.0]]
    every = max(1, p.keys // SAMPLES)
    t0 = time.perf_counter()
    for i in range(p.keys):
        lock = lock_cls(state, f"lock:{i}", ttl=30.0)
        await lock.acquire()
        await lock.release()
        await dedupe.first_seen(f"evt-{i}")
        if i % 10 == 9:
            await state.acquire(f"stale:{i}", "crashed-holder", p.ttl)
        if (i + 1) % every == 0:
            locks, records = state.size()
            samples.append([i + 1, rss_mib(), locks, records, time.perf_counter() - t0])
            _progress_line(i + 1, p.keys)
    run_s = time.perf_counter() - t0
    end_locks, end_dedupe = state.size()
    end_rss = rss_mib()
    if p.wait:
        await asyncio.sleep(p.ttl + 0.5)
    ttl_locks, ttl_dedupe = state.size()
    sweep: list[list[float]] = [[0, ttl_locks, ttl_dedupe]]
    step = max(1, p.sweep_ops // 20)
    for j in range(p.sweep_ops):
        lock = lock_cls(state, "hot", ttl=30.0)
        await lock.acquire()
        await lock.release()
        await dedupe.first_seen("hot-evt")
        if (j + 1) % step == 0:
            sweep.append([j + 1, *state.size()])
    gc.collect()
    after_locks, after_dedupe = state.size()
    half = samples[len(samples) // 2][1]
    return {
        "keys": p.keys,
        "keys_s": p.keys / run_s,
        "run_s": run_s,
        "rss_before": before,
        "rss_peak": peak_mib(),
        "rss_end": end_rss,
        "growth_second_half": samples[-1][1] - half,
        "growth_total": samples[-1][1] - before,
        "end_locks": end_locks,
        "end_dedupe": end_dedupe,
        "ttl_locks": ttl_locks,
        "ttl_dedupe": ttl_dedupe,
        "after_locks": after_locks,
        "after_dedupe": after_dedupe,
        "rss_after": rss_mib(),
        "samples": samples,
        "sweep": sweep,
    }


async def _spawn(p: Params, label: str) -> dict[str, Any]:
    """Run one child; its stderr drives the progress bar, its stdout is the JSON result."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.scenarios.memory_growth",
        json.dumps(asdict(p)),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    errors: list[str] = []
    with _progress.step(label, p.keys) as bar:
        out_task = asyncio.ensure_future(proc.stdout.read())
        async for raw in proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            parts = line.split()
            if len(parts) == 3 and parts[0] == "progress":
                bar.update(float(parts[1]))
            elif line:
                errors.append(line)
        out = await out_task
    code = await proc.wait()
    if code != 0:
        tail = " / ".join(errors[-3:]) or "no output"
        raise RuntimeError(f"child exited with {code}: {tail}")
    result: dict[str, Any] = json.loads(out.decode())
    return result


async def run(cfg: Config, api: Asynclock | str) -> Section:
    keys = 200_000 if cfg.quick else 1_000_000
    ttl = 2.0 if cfg.quick else 5.0
    children = cfg.rounds_or(1, 1)
    sweep_ops = 20_000
    variants = {
        SHORT: Params(keys, ttl, True, sweep_ops),
        CONTROL: Params(keys, 600.0, False, sweep_ops),
    }
    rounds = Rounds()
    curves: dict[str, Any] = {}
    for name in variants:
        rounds.declare(name)
    started = now_utc()
    if isinstance(api, str):
        for name in variants:
            rounds.skip(name, api)
    for r in range(children if not isinstance(api, str) else 0):
        fill = 0  # the sample index from which the short TTL's window is full
        for name, params in variants.items():
            short = "short TTL" if name == SHORT else "control"
            try:
                result = await _spawn(params, f"memory-growth {short} {r + 1}/{children}")
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                rounds.skip(name, f"{type(exc).__name__}: {exc}")
                log(f"memory-growth: {short} failed: {exc!r}")
                continue
            curves.setdefault(name, {"samples": result["samples"], "sweep": result["sweep"]})
            metrics = {k: float(v) for k, v in result.items() if isinstance(v, (int, float))}
            metrics["end_entries"] = metrics["end_locks"] + metrics["end_dedupe"]
            metrics["ttl_entries"] = metrics["ttl_locks"] + metrics["ttl_dedupe"]
            metrics["after_entries"] = metrics["after_locks"] + metrics["after_dedupe"]
            samples = result["samples"]
            if name == SHORT:  # first sample taken when the first keys' TTL had passed
                late = [i for i, row in enumerate(samples) if row[4] >= params.ttl * 1.1]
                fill = late[0] if late else len(samples) - 1
            metrics["fill_keys"] = samples[fill][0]
            metrics["growth_after_fill"] = samples[-1][1] - samples[fill][1]
            rounds.add(name, metrics)
            log(
                f"memory-growth {short}: {result['keys_s']:,.0f} keys/s, RSS "
                f"{result['rss_before']:.0f} -> peak {result['rss_peak']:.0f} -> after "
                f"{result['rss_after']:.0f} MiB; entries left {metrics['after_entries']:,.0f}"
            )
    record_data("curves", curves)
    record_data("params", {name: asdict(p) for name, p in variants.items()})
    return _section(rounds, keys, ttl, children, sweep_ops, started, cfg.quick)


def _section(
    rounds: Rounds, keys: int, ttl: float, children: int, sweep_ops: int, started: str, quick: bool
) -> Section:
    rss_cols = [
        Column("keys/s", "keys_s"),
        Column("RSS before MiB", "rss_before", 1),
        Column("peak RSS MiB", "rss_peak", 1),
        Column("RSS growth from key F to the last key MiB", "growth_after_fill", 1),
        Column("F: first key after the TTL window filled", "fill_keys"),
        Column("RSS after the TTL and the sweep MiB", "rss_after", 1),
    ]
    entry_cols = [
        Column("locks + dedupe records at the end of the keys", "end_entries"),
        Column("after the TTL passed (not swept yet)", "ttl_entries"),
        Column(f"after {sweep_ops:,} more operations (the sweep)", "after_entries"),
        Column("of which locks", "after_locks"),
        Column("of which dedupe records", "after_dedupe"),
    ]
    scale = "200,000 (--quick; the full run uses 1,000,000)" if quick else "1,000,000"
    body = [
        "## Memory growth: MemoryState over a million distinct keys",
        "",
        (
            f"{scale} distinct keys per child process, {children} child per variant (a fresh "
            f"`python -m benchmarks.scenarios.memory_growth` each, so peak RSS is VmHWM of that process alone). "
            f"Per key `i`: `AsyncLock(state, 'lock:i')` acquired and released, "
            f"`Deduper(state, ttl=T).first_seen('evt-i')`, and for every tenth key "
            f"`state.acquire('stale:i', ...)` that is never released (a crashed holder, expiring "
            f"by the same TTL T). Short TTL: T = {ttl:g} s; then the child waits T, runs "
            f"{sweep_ops:,} more lock pairs on one hot key, each with `first_seen` of one "
            f"duplicate id (every operation sweeps up to 32 expired entries), and counts what "
            f"`MemoryState.size()` still holds. Control: T = 600 s, nothing expires. "
            f"F is the first sample (of {SAMPLES}) taken more than 1.1 T after the short-TTL "
            f"child started, when the oldest entries had expired; the control is read over the "
            f"same keys. Started {started}."
        ),
        "",
        table(rounds, rss_cols),
        "",
        table(rounds, entry_cols),
        "",
        kept("memory-growth-rss"),
    ]
    headlines: list[tuple[str, str]] = []
    if rounds.rounds_of(SHORT):
        grow = rounds.spread(SHORT, "growth_after_fill")
        left = rounds.spread(SHORT, "after_entries")
        peak = rounds.spread(SHORT, "rss_peak")
        before = rounds.spread(SHORT, "rss_before")
        headlines += [
            (
                f"MemoryState RSS over {keys:,} keys (short TTL): before / peak MiB",
                f"{fmt(before.median, 0)} / {fmt_spread(peak, 0)}",
            ),
            ("MemoryState RSS growth after the TTL window filled MiB", fmt_spread(grow, 1)),
            ("MemoryState entries left after the TTL and the sweep", fmt_spread(left, 0)),
        ]
    if rounds.rounds_of(CONTROL):
        grow = rounds.spread(CONTROL, "growth_after_fill")
        headlines.append(
            ("control (TTL 600 s) RSS growth over the same keys MiB", fmt_spread(grow, 1))
        )
    return Section("memory-growth", "\n".join(body), headlines)


def _main(argv: list[str]) -> int:
    params = Params(**json.loads(argv[0]))
    result = asyncio.run(_child(params))
    print(json.dumps(result))
    return 0


SCENARIO = Scenario("memory-growth", run, redis=False)


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
