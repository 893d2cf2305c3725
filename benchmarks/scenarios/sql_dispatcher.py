"""Scenario ``sql-dispatcher``: EventDispatcher on the SQL states against chat-sdk on PostgreSQL.

The Redis part of scenario ``dispatcher`` on PostgreSQL (and MariaDB for scale), then one
counting pass of statements and pool resets per fresh event: docs/benchmarks.md,
``sql-dispatcher``. Rows are written under a key prefix of this run and deleted at the end.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from benchmarks.harness.dispatching import (
    AsynclockDispatcher,
    ChatSdk,
    Dispatching,
    chat_sdk,
    dispatch_rounds,
    drive,
    events,
    rate_columns,
    set_up_rows,
)
from benchmarks.harness.env import (
    Asynclock,
    Config,
    commit,
    dist_version,
    log,
    now_utc,
    short,
)
from benchmarks.harness.report import Column, Rounds, Section, kept, table
from benchmarks.harness.rounds import teardown
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.sql_server import MYSQL_URL, PG_URL, pg_connect
from benchmarks.harness.sql_server import cleanup as sql_cleanup

if TYPE_CHECKING:
    from collections.abc import Iterator

P_ASYNCLOCK = "**asynclock** EventDispatcher(PostgresState), drop (serial)"
P_CHAT = "chat-sdk Chat(PostgresStateAdapter), drop (serial)"
M_ASYNCLOCK = "asynclock EventDispatcher(MySQLState) on MariaDB, drop (serial)"
ROWS = (P_ASYNCLOCK, P_CHAT, M_ASYNCLOCK)
CHAT_TABLES = ("chat_state_cache", "chat_state_locks", "chat_state_lists", "chat_state_queues")


class ChatSdkPostgres(ChatSdk):
    """chat-sdk's ``Chat`` on its PostgreSQL state (its own default asyncpg pool)."""

    def __init__(self, sdk: Any, cfg: Config, adapter: Any, prefix: str) -> None:
        super().__init__(P_CHAT, sdk, cfg, burst=False, redis=False)
        self.adapter_class, self.prefix = adapter, prefix

    def make_state(self) -> Any:
        return self.adapter_class(url=PG_URL, key_prefix=self.prefix)


class StatementCounter:
    """Statements sent by asyncpg and aiomysql connections, and asyncpg pool resets.

    Patches the drivers' methods for the duration of :meth:`counting` only (the counting pass,
    never a timed round).
    """

    def __init__(self) -> None:
        self.statements = 0
        self.resets = 0

    @contextlib.contextmanager
    def counting(self) -> Iterator[None]:
        asyncpg_connection = importlib.import_module("asyncpg.connection").Connection
        counter = self
        patched: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, field: str) -> None:
            original = getattr(owner, name)

            async def counted(*args: Any, **kwargs: Any) -> Any:
                setattr(counter, field, getattr(counter, field) + 1)
                return await original(*args, **kwargs)

            patched.append((owner, name, original))
            setattr(owner, name, counted)

        patch(asyncpg_connection, "_execute", "statements")
        patch(asyncpg_connection, "reset", "resets")
        with contextlib.suppress(ImportError):
            patch(importlib.import_module("aiomysql").Cursor, "execute", "statements")
        try:
            yield
        finally:
            for owner, name, original in reversed(patched):
                setattr(owner, name, original)


async def run(cfg: Config, api: Asynclock | str) -> Section:
    n = 500 if cfg.quick else 1000
    keys = 50
    rounds_n = cfg.rounds_or(5, 3)
    rounds = Rounds()
    for name in ROWS:
        rounds.declare(name)
    prefix = cfg.key("sql-dispatcher") + ":"
    variants: list[Dispatching] = []
    if isinstance(api, str):
        rounds.skip(P_ASYNCLOCK, api)
        rounds.skip(M_ASYNCLOCK, api)
    else:
        module = api.module

        def pg_state() -> Any:
            return module.PostgresState.from_url(PG_URL, prefix=prefix)

        def mysql_state() -> Any:
            return module.MySQLState.from_url(MYSQL_URL, prefix=prefix)

        variants += [
            AsynclockDispatcher(P_ASYNCLOCK, api, pg_state, burst=False, redis=False),
            AsynclockDispatcher(M_ASYNCLOCK, api, mysql_state, burst=False, redis=False),
        ]
    sdk = chat_sdk()
    try:
        adapter = importlib.import_module("chat_sdk.state.postgres").PostgresStateAdapter
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        sdk = sdk if isinstance(sdk, str) else f"chat_sdk.state.postgres: {exc!r}"
    if isinstance(sdk, str):
        rounds.skip(P_CHAT, sdk)
    else:
        variants.append(ChatSdkPostgres(sdk, cfg, adapter, prefix))

    def rows(variant: Dispatching) -> Rounds:
        return rounds

    scenario = "sql-dispatcher"
    live = await set_up_rows(variants, rows, warmup=min(n, 200), keys=keys, scenario=scenario)
    started = now_utc()
    try:
        refs = {P_ASYNCLOCK: {"chat": P_CHAT}}
        await dispatch_rounds(
            live, variants, rows, n=n, keys=keys, rounds_n=rounds_n, refs=refs, scenario=scenario
        )
        counts = await _count_statements(live, n, keys)
    finally:
        for variant in live:
            await teardown(variant, "sql-dispatcher")
        await _cleanup(prefix)
    versions = {"chat-sdk": dist_version("chat-sdk"), "git": commit()}
    return _section(rounds, counts, n, keys, rounds_n, started, versions)


async def _count_statements(live: list[Dispatching], n: int, keys: int) -> Rounds:
    counts = Rounds()
    for name in ROWS:
        counts.declare(name)
    counter = StatementCounter()
    for index, variant in enumerate(live):
        per_key = events(variant, f"count-v{index}", n, keys)
        variant.reset()
        statements, resets = counter.statements, counter.resets
        try:
            with counter.counting():
                await drive(variant, per_key)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            counts.skip(variant.name, f"{type(exc).__name__}: {exc}")
            continue
        metrics = {
            "statements_event": (counter.statements - statements) / n,
            "resets_event": (counter.resets - resets) / n,
        }
        counts.add(variant.name, metrics)
        log(f"sql-dispatcher: {short(variant.name)}: {metrics['statements_event']:.2f}/event")
    return counts


async def _cleanup(prefix: str) -> None:
    """Delete this run's rows: asynclock's (scenario ``sql``'s clean-up) and chat-sdk's."""
    log(f"sql-dispatcher: deleted this run's rows: {await sql_cleanup(prefix)}")
    try:
        conn = await pg_connect(PG_URL, synchronous_commit=None)
        try:
            for table_name in CHAT_TABLES:
                await conn.execute(f"DELETE FROM {table_name} WHERE key_prefix = $1", prefix)
        finally:
            await conn.close()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"sql-dispatcher: chat-sdk clean-up failed: {exc!r}")


def _section(
    rounds: Rounds,
    counts: Rounds,
    n: int,
    keys: int,
    rounds_n: int,
    started: str,
    versions: dict[str, str],
) -> Section:
    cols = [
        *rate_columns("events/s"),
        Column("÷ chat-sdk (throughput)", "x_chat", 2),
        Column("handler calls", "handled"),
    ]
    count_cols = [
        Column("statements per fresh event", "statements_event", 2, median_only=True),
        Column("asyncpg pool resets per event", "resets_event", 2, True),
    ]
    body = [
        "## Dispatcher on PostgreSQL: EventDispatcher and chat-sdk",
        "",
        (
            f"{n:,} events over {keys} thread keys per variant and round (event i on key i mod "
            f"{keys}, each with a fresh message id), {rounds_n} rounds, interleaved round-robin "
            "(the starting variant rotates)."
        ),
        "",
        kept("sql-dispatcher-intro"),
        "",
        f"Started {started}, asynclock git {versions['git']}; chat-sdk {versions['chat-sdk']}.",
        "",
        table(rounds, cols),
        "",
        "### Statements per fresh event",
        "",
        f"One more run of each variant after the timed rounds ({n:,} fresh events).",
        "",
        kept("sql-dispatcher-count"),
        "",
        table(counts, count_cols),
        "",
    ]
    return Section("sql-dispatcher", "\n".join(body))


SCENARIO = Scenario("sql-dispatcher", run, redis=False)
