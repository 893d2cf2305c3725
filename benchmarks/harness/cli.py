"""Command line: ``python -m benchmarks <scenario> [--state URL] [--quick] [--rounds N]``."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness import progress as _progress
from benchmarks.harness import results as _results
from benchmarks.harness.env import (
    DEFAULT_URL,
    REPO,
    Config,
    background_rate,
    delete_run_keys,
    environment_facts,
    is_loopback_url,
    load_asynclock,
    log,
    now_utc,
)
from benchmarks.harness.report import (
    Section,
    doc_text,
    fill_kept,
    kv_table,
    take_recorded,
    write_doc,
)
from benchmarks.harness.servers import DEFAULT_CLUSTER_URL, PrivateServer, configure

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.harness.results import View
    from benchmarks.harness.scenario import Scenario

#: the scenarios (name -> Scenario), in the doc's order; set by :func:`main`
SCENARIOS: dict[str, Scenario] = {}
#: draws the blocks derived from every scenario's stored numbers (targets, with ``plots`` the
#: PNGs too); set by :func:`main`
_VIEWS: list[Callable[[View, bool], list[Section]]] = []

#: the top of a new docs/benchmarks.md and of the stdout report; the doc's own text above its
#: environment block (how to run what, hand-written) is kept by ``--write``
PREAMBLE = """# Benchmarks

asynclock against its peers, measured in one process on one machine and one Redis server, with
the variants interleaved round-robin in every round. Cells show **median (min-max)** over the
rounds. The machine is small and shared (the Redis server and the client run on the same two
vCPUs), so single runs vary by ±30%: **compare the ratios taken within one run, not absolute
numbers**, and do not carry the absolute numbers to other hardware.
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="asynclock benchmarks against redis-py's Lock, python-redis-lock, pottery, the raw "
        "redis.asyncio floor, asyncio.Lock and (dispatcher) chat-sdk. Markdown report on stdout.",
    )
    parser.add_argument(
        "scenario",
        choices=[*SCENARIOS, "all", "plots"],
        help="a scenario, all of them, or plots: only redraw docs/img/*.png (and with --write "
        "the targets and plots blocks) from benchmarks/summary/medians.json",
    )
    parser.add_argument("--state", default=DEFAULT_URL, help=f"Redis URL (default {DEFAULT_URL})")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and pairs (< 1 min)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per scenario")
    parser.add_argument("--write", action="store_true", help="also write docs/benchmarks.md")
    parser.add_argument(
        "--doc", default=str(REPO / "docs" / "benchmarks.md"), help="where --write writes"
    )
    parser.add_argument(
        "--plots",
        action="store_true",
        help="after the run, draw docs/img/*.png from the stored results merged with this run's",
    )
    parser.add_argument(
        "--private-server",
        action="store_true",
        help="start a throwaway redis-server on a free loopback port for this run (clean "
        "command counts; the shared server's other clients are not counted)",
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="URL",
        help="the Redis Cluster of the cluster scenario (default: a private throwaway 3-master "
        f"cluster with --private-server, else {DEFAULT_CLUSTER_URL})",
    )
    parser.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a Redis server that is not on a loopback address",
    )
    return parser


def _finish(
    args: argparse.Namespace,
    snapshots: dict[str, dict[str, Any]],
    facts: list[tuple[str, str]],
) -> list[Section]:
    """Store this run's numbers (with --write), draw plots (--plots); the extra blocks."""
    if args.write:
        summary = _results.save(snapshots, facts)
        log(f"wrote {_results.RESULTS} and {_results.SUMMARY}")
    else:
        fresh = {k: _results.summarize(v) for k, v in snapshots.items()}
        summary = _results.merge(_results.load(), fresh, facts)
    return _VIEWS[0](_results.View(summary), args.plots or args.scenario == "plots")


def _plots_only(args: argparse.Namespace) -> int:
    stored = _results.load()
    if not stored.get("scenarios"):
        log(f"no stored results in {_results.SUMMARY}: run a scenario with --write first")
        return 2
    extra = _finish(args, {}, [])
    path = Path(args.doc)
    print(fill_kept("\n".join(s.body + "\n" for s in extra), doc_text(path)))
    if args.write:
        facts = [(str(k), str(v)) for k, v in stored.get("environment", {}).items()]
        environment = "## Environment\n\n" + kv_table(facts) + "\n"
        write_doc(path, order=_order(), preamble=PREAMBLE, environment=environment, sections=extra)
        log(f"wrote {path}")
    return 0


async def _amain(args: argparse.Namespace) -> int:
    if args.scenario == "plots":
        return _plots_only(args)
    cfg = Config(url=args.state, quick=args.quick, rounds=args.rounds, write=args.write)
    names = (
        [n for n, s in SCENARIOS.items() if s.in_all] if args.scenario == "all" else [args.scenario]
    )
    if cfg.rounds is not None and cfg.rounds < 1:
        log("--rounds must be at least 1")
        return 2
    client: redis.asyncio.Redis | None = None
    if any(SCENARIOS[n].redis for n in names):
        if not is_loopback_url(cfg.url) and not args.allow_remote:
            log(f"refusing {cfg.url}: not a loopback address (use --allow-remote if you mean it)")
            return 2
        client = redis.asyncio.Redis.from_url(cfg.url)
        try:
            await client.ping()
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            log(f"cannot reach Redis at {cfg.url}: {exc!r}")
            await client.aclose()
            return 2
    api = load_asynclock()
    log(f"asynclock: {api if isinstance(api, str) else 'version ' + api.version}")
    background = await background_rate(client) if client is not None else 0.0
    where = cfg.url if client else "memory:// only"
    if client is not None and args.private_server:
        where += ' (a private throwaway redis-server: --save "" --appendonly no)'
    facts = await environment_facts(client, where, api)
    sections: list[Section] = []
    snapshots: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    try:
        with _progress.run_display(len(names)):
            for index, name in enumerate(names):
                _progress.scenario(name, index)
                log(f"--- {name}")
                started, started_at = time.monotonic(), now_utc()
                take_recorded()
                sections.append(await SCENARIOS[name].run(cfg, api))
                rounds, data = take_recorded()
                snapshots[name] = _results.snapshot(
                    rounds, data, run=cfg.run_id, started=started_at, quick=cfg.quick
                )
                log(f"--- {name} took {time.monotonic() - started:.1f} s")
            _progress.finished(len(names))
    finally:
        if client is not None:
            deleted = await delete_run_keys(client, cfg.run_id)
            log(f"deleted {deleted} key(s) of run {cfg.run_id}")
            await client.aclose()
    if client is not None:
        where = "private throwaway server" if args.private_server else "shared server"
        facts.append(("server load before the run", f"{background:,.0f} commands/s ({where})"))
    kind = "quick" if cfg.quick else "full"
    facts.append(("run", f"{cfg.run_id}, {kind}, {time.monotonic() - t0:.0f} s"))
    environment = "## Environment\n\n" + kv_table(facts) + "\n"
    headlines = [h for s in sections for h in s.headlines]
    extra = _finish(args, snapshots, facts)
    report = [PREAMBLE, environment]
    if headlines:
        report.append("## Headline ratios\n\n" + kv_table(headlines) + "\n")
    report += [s.body + "\n" for s in [*extra, *sections]]
    sections = [*extra, *sections]
    path = Path(args.doc)
    print(fill_kept("\n".join(report), doc_text(path)))
    if args.write:
        kept = len(names) == 1 and SCENARIOS[names[0]].own_environment
        write_doc(
            path,
            order=_order(),
            preamble=PREAMBLE,
            environment=None if kept else environment,
            sections=sections,
        )
        log(f"wrote {path}")
    return 0


def _order() -> list[str]:
    return ["targets", "plots", *SCENARIOS]


def main(
    scenarios: list[Scenario],
    views: Callable[[View, bool], list[Section]],
    argv: list[str] | None = None,
) -> int:
    """Run the command line over ``scenarios``; ``views`` draws targets and plots."""
    SCENARIOS.update((s.name, s) for s in scenarios)
    _VIEWS[:] = [views]
    parser = _parser()
    args = parser.parse_args(argv)
    configure(url=args.cluster, private=args.private_server)
    if not args.private_server:
        return asyncio.run(_amain(args))
    if args.state != DEFAULT_URL:
        parser.error("--private-server and --state are exclusive")
    try:
        with PrivateServer() as server:
            log(f"private redis-server on {server.url}")
            args.state = server.url
            return asyncio.run(_amain(args))
    except (OSError, RuntimeError) as exc:
        log(f"cannot start a private redis-server: {exc}")
        return 2
