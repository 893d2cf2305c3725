"""Scenario ``sql``: PostgresState and MySQLState against the raw floor of their own statements.

Uncontended pairs, contention on one key (one process; 3 spawned processes) and
``Deduper.first_seen``, each interleaved round-robin (docs/benchmarks.md, the ``sql`` block).
Rows go to the states' default tables under a key prefix of this run and are deleted at the
end; the tables themselves are never dropped. This module runs the parts and writes the
report; the rows of parts 1 and 3 are in ``_sql_variants``, part 2 in ``_sql_contention``, the
servers (URLs, statements, connections, facts, clean-up) in ``harness/sql_server.py``.
"""

from __future__ import annotations

import time

from benchmarks.harness.contend import columns
from benchmarks.harness.env import (
    KEY_ROOT,
    Asynclock,
    Config,
    dist_version,
    general_facts,
    log,
    now_utc,
)
from benchmarks.harness.pairs import RedisFloor
from benchmarks.harness.report import (
    Column,
    Headlines,
    Rounds,
    Section,
    kept,
    kv_table,
    table,
    violations,
)
from benchmarks.harness.scenario import Scenario, Variant
from benchmarks.harness.sql_server import (
    LABEL,
    MYSQL_URL,
    PG_URL,
    cleanup,
    commit_label,
    mysql_facts,
    pg_facts,
    pg_session_text,
    pg_state_commit,
    pg_supports_durable,
)
from benchmarks.harness.states import STATE_CLASSES
from benchmarks.harness.stats import fmt
from benchmarks.scenarios._sql_contention import (
    PROCESSES,
    TASKS_PER_PROCESS,
    WORKERS,
    Contention,
    cycles_per_task,
    multi_name,
    run_contention,
    single_name,
)
from benchmarks.scenarios._sql_variants import (
    DUPLICATE_IDS,
    AsynclockListening,
    AsynclockPairs,
    DedupeAsynclock,
    DedupeRaw,
    MyRaw,
    MySelect,
    PgRaw,
    PgSelect,
    interleave,
)

# -- the scenario ----------------------------------------------------------------------------------


#: what the targets view reads besides the scenario (the contended rows' names and shape)
__all__ = ["PROCESSES", "RAW_FLOOR", "SCENARIO", "TASKS_PER_PROCESS", "multi_name", "run"]

RAW_FLOOR = "Redis raw floor: redis.asyncio SET NX PX + EVALSHA"


async def run(cfg: Config, api: Asynclock | str) -> Section:
    started = now_utc()
    t0 = time.monotonic()
    prefix = f"{KEY_ROOT}:{cfg.run_id}:"  # the states' key prefix; every row of this run has it
    urls = {"postgres": PG_URL, "mysql": MYSQL_URL, "redis": cfg.url}
    # many short rounds: a burst of other load on the shared machine hits one short round of
    # a few variants, and the median over the rounds leaves it out
    rounds_n = cfg.rounds_or(15, 4)
    n = 400 if cfg.quick else 700
    facts = await general_facts(cfg, api)
    commit = pg_state_commit(api)
    for name, url in (("postgres", PG_URL), ("mysql", MYSQL_URL)):
        try:
            facts += await (pg_facts(url, commit) if name == "postgres" else mysql_facts(url))
        except Exception as exc:  # noqa: BLE001, PERF203 (reported, never fatal)
            facts.append((url, f"not reached: {exc!r}"))
    states = (
        "`PostgresState.from_url(url, prefix=...)`, `MySQLState.from_url(url, prefix=...)`, "
        "`RedisState.from_url(url, prefix=...)`, defaults otherwise (tables `asynclock_locks` "
        "and `asynclock_dedupe`)"
    )
    facts += [("drivers", _drivers()), ("asynclock states", states)]

    uncontended, dedupe = Rounds(), Rounds()
    contention = Contention()
    try:
        if isinstance(api, str):
            for r in (uncontended, dedupe, contention.single, contention.multi):
                r.skip("asynclock", api)
        else:
            variants = _pair_variants(api, cfg, prefix)
            await interleave(variants, uncontended, n, rounds_n, "uncontended")
            contention = await run_contention(cfg, api, prefix, urls, cfg.rounds_or(5, 3))
            dedupe_variants = _dedupe_variants(api, prefix)
            await interleave(dedupe_variants, dedupe, n, rounds_n, "dedupe")
    finally:
        cleaned = await cleanup(prefix)
        log(f"sql: deleted this run's rows: {cleaned}")
    kind = "quick" if cfg.quick else "full"
    took = time.monotonic() - t0
    facts.append(("run", f"{cfg.run_id}, {kind}, {took:.0f} s, started {started}"))
    return _section(cfg, commit, facts, uncontended, contention, dedupe, n, rounds_n)


def _drivers() -> str:
    return ", ".join(
        f"{name} {dist_version(name)}" for name in ("asyncpg", "aiomysql", "PyMySQL", "redis")
    )


def _pair_variants(api: Asynclock, cfg: Config, prefix: str) -> list[Variant]:
    commit = pg_state_commit(api)
    pg_sel = PgSelect()
    pg_raw = PgRaw(prefix, "postgres:raw", commit)  # the state's default session
    pg_raw_other = PgRaw(prefix, "postgres:raw-other", "off" if commit is None else None)
    pg = AsynclockPairs(api, "postgres", PG_URL, prefix, "postgres:uncontended")
    pg_listening = AsynclockListening(api, PG_URL, prefix, "postgres:listening")
    pg_fast: Variant | None = None
    if pg_supports_durable(api):
        pg_fast = AsynclockPairs(
            api, "postgres", PG_URL, prefix, "postgres:not-durable", durable=False
        )
        pg_fast.refs.update(raw=pg_raw_other.name, select=pg_sel.name)
    my_sel, my_raw = MySelect(), MyRaw(prefix, "mysql:raw")
    my = AsynclockPairs(api, "mysql", MYSQL_URL, prefix, "mysql:uncontended")
    rd_raw = RedisFloor(RAW_FLOOR, cfg.url, prefix + "redis:raw")
    rd = AsynclockPairs(api, "redis", cfg.url, prefix, "redis:uncontended")
    for v, raw, sel in ((pg, pg_raw, pg_sel), (my, my_raw, my_sel), (rd, rd_raw, None)):
        v.refs["raw"] = raw.name
        if sel is not None:
            v.refs["select"] = sel.name
            raw.refs["select"] = sel.name
        v.refs["redis"] = rd.name
        raw.refs["raw"] = raw.name
    pg_raw_other.refs.update(raw=pg_raw.name, select=pg_sel.name)
    pg_listening.refs.update(raw=pg_raw.name, select=pg_sel.name, redis=rd.name)
    rd_raw.refs["redis"] = rd.name
    pg_rows: list[Variant] = [pg_sel, pg_raw, pg, pg_listening, pg_raw_other]
    if pg_fast is not None:
        pg_fast.refs["redis"] = rd.name
        pg_rows.append(pg_fast)
    return [*pg_rows, my_sel, my_raw, my, rd_raw, rd]


def _dedupe_variants(api: Asynclock, prefix: str) -> list[Variant]:
    commit = pg_state_commit(api)
    out: list[Variant] = []
    for backend, url in (("postgres", PG_URL), ("mysql", MYSQL_URL)):
        for duplicate in (False, True):
            tag = f"{backend}-{'dup' if duplicate else 'new'}"
            raw = DedupeRaw(backend, prefix, f"raw-{tag}", duplicate, commit)
            lib = DedupeAsynclock(api, backend, url, prefix, f"lib-{tag}", duplicate)
            lib.refs["raw"] = raw.name
            raw.refs["raw"] = raw.name
            out += [raw, lib]
    return out


def _section(
    cfg: Config,
    commit: str | None,
    facts: list[tuple[str, str]],
    pairs: Rounds,
    contention: Contention,
    dedupe: Rounds,
    n: int,
    rounds_n: int,
) -> Section:
    pair_cols = [
        Column("acquire+release pairs/s", "rate"),
        Column("µs per pair", "us"),
        Column("client CPU µs per pair", "cpu_us"),
        Column("÷ raw floor (same backend and commit setting)", "x_raw", 2),
        Column("÷ 2 x SELECT 1 (same backend)", "x_select", 2),
        Column("÷ asynclock RedisState", "x_redis", 2),
    ]
    single_cols = columns(
        "cycles_s",
        "xh_p50",
        "xh_p99",
        "w_p99",
        "w_max",
        "streak",
        "violations",
        "overlaps",
        "cycles",
    )
    multi_cols = columns(
        "cycles_s",
        "xg_p50",
        "xg_p99",
        "xg_count",
        "xh_p50",
        "xh_p99",
        "w_max",
        "violations",
        "overlaps",
        "cycles",
    )
    dedupe_cols = [
        Column("ops/s", "rate"),
        Column("µs per op", "us"),
        Column("client CPU µs per op", "cpu_us"),
        Column("÷ raw floor (same statement, same ids)", "x_raw", 2),
    ]
    multi_cycles = cycles_per_task(cfg)[1]
    body = [
        "## SQL states: PostgresState and MySQLState (MariaDB)",
        "",
        (
            f"Scenario `sql`, one process (plus spawned children for the multi-process rows), "
            f"{rounds_n} rounds of the uncontended and dedupe parts and "
            f"{cfg.rounds_or(5, 3)} of the contended part, variants interleaved round-robin "
            "(the starting variant rotates). Cells: median (min-max) over the rounds; ratios "
            "are taken within each round, then summarised. PostgreSQL, MariaDB, Redis and the "
            "client share the machine's two vCPUs."
        ),
        "",
        kv_table(facts),
        "",
        "### Uncontended acquire+release, 1 task, one key",
        "",
        f"{n:,} pairs per variant and round.",
        "",
        table(pairs, pair_cols),
        "",
        kept("sql-rows"),
        (
            "- the floor runs once with the server's `synchronous_commit` (`on`: each commit "
            "waits for its WAL flush) and once with `off` (it does not). Each asynclock row's "
            "ratio is taken against the floor with the same setting: "
            + pg_session_text(commit)
            + "."
        ),
        kept("sql-rows-more"),
        "",
        f"### Contended: {WORKERS} tasks x {cycles_per_task(cfg)[0]} cycles on one key, one process",
        "",
        table(contention.single, single_cols),
        "",
        (
            f"### {PROCESSES} processes x {TASKS_PER_PROCESS} tasks x {multi_cycles} cycles on "
            "one key (multiprocessing, spawn)"
        ),
        "",
        kept("sql-multi"),
        "",
        table(contention.multi, multi_cols),
        "",
        kept("sql-definitions"),
        "",
        "### Dedupe: `Deduper.first_seen` against the raw statement, 1 task",
        "",
        (
            f"{n:,} calls per variant and round. New ids: never seen before (the row is "
            f"inserted). Duplicates: {DUPLICATE_IDS} ids recorded in setup, asked again in turn "
            "(a live record: nothing is written)."
        ),
        "",
        table(dedupe, dedupe_cols),
        "",
        kept("sql-dedupe-rows"),
        (
            f"- Rows are written under the key prefix `{KEY_ROOT}:<run id>:` in the default "
            "tables and deleted at the end of the run."
        ),
    ]
    headlines = Headlines()
    add = headlines.metric
    for backend in ("postgres", "mysql"):
        cls = STATE_CLASSES[backend]
        lib = f"**asynclock** `async with AsyncLock` ({cls})"
        setting = f", {commit_label(commit)}" if backend == "postgres" else ""
        label = f"{cls} uncontended pair ÷ raw floor of its statements{setting}"
        add(label, pairs, lib, "x_raw", 2, note=_pairs_note(pairs, lib))
        fast = f"**asynclock** `async with AsyncLock` ({cls}, durable=False)"
        if fast in pairs.variants:
            label = f"{cls}(durable=False) uncontended pair ÷ raw floor, synchronous_commit=off"
            add(label, pairs, fast, "x_raw", 2, note=_pairs_note(pairs, fast))
        add(f"{cls} uncontended pair ÷ 2 x SELECT 1", pairs, lib, "x_select", 2)
        add(f"{cls} 16 tasks: cross-worker handoff p50 ms", contention.single,
            single_name(backend), "xh_p50", 3)  # fmt: skip
        add(f"{cls} 16 tasks: cross-worker handoff p99 ms", contention.single,
            single_name(backend), "xh_p99", 3)  # fmt: skip
        add(f"{cls} 3 processes: cross-process handoff p50 ms", contention.multi,
            multi_name(backend), "xg_p50", 3)  # fmt: skip
        add(f"{cls} 3 processes: cross-process handoff p99 ms", contention.multi,
            multi_name(backend), "xg_p99", 3)  # fmt: skip
        for dup in (False, True):
            what = "duplicates" if dup else "new ids"
            name = f"**asynclock** `Deduper.first_seen`, {what} ({LABEL[backend]})"
            add(f"{cls} Deduper.first_seen {what} ÷ raw statement", dedupe, name, "x_raw", 2)
    headlines.add(
        "SQL mutual-exclusion violations, all variants and rounds",
        fmt(float(violations([contention.single, contention.multi])), 0),
    )
    return Section("sql", "\n".join(body), headlines.rows)


def _pairs_note(pairs: Rounds, variant: str) -> str:
    return f" ({fmt(pairs.spread(variant, 'rate').median, 0)} pairs/s)"


SCENARIO = Scenario("sql", run, own_environment=True)
