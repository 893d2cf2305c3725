"""Scenario ``sql``: PostgresState and MySQLState against the raw floor of their own statements.

Three parts, each interleaved round-robin (the starting variant rotates every round):

1. uncontended acquire+release pairs (``async with AsyncLock(state, key, ttl=30.0)``) against
   the same ``acquire`` and ``release`` statements of ``queries.sql`` issued directly by the
   driver on one connection, the ``SELECT 1`` x2 round-trip floor, and RedisState for scale;
2. contention on one key: 16 tasks in one process, and 3 spawned processes x 4 tasks;
3. ``Deduper.first_seen`` (new ids and duplicates) against the raw ``dedupe_add`` statement.

Rows are written to the states' default tables (``asynclock_locks``, ``asynclock_dedupe``) under
a key prefix of this run, and deleted at the end; the tables themselves are never dropped.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import inspect
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import redis.asyncio

from benchmarks import _sql_procs
from benchmarks._contend import analyze, contend
from benchmarks._env import (
    KEY_ROOT,
    RELEASE_SCRIPT,
    Asynclock,
    Config,
    _dist_version,
    _redact,
    environment_facts,
    log,
    now_utc,
)
from benchmarks._report import Column, Rounds, Section, kv_table, table
from benchmarks._stats import fmt, fmt_spread

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

PG_URL = os.environ.get("ASYNCLOCK_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("ASYNCLOCK_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")

#: what the states pass, read from asynclock/state/{postgres,mysql}/__init__.py
TABLE_PREFIX = "asynclock_"  # the default table_prefix
TTL_MS = 30_000  # AsyncLock(..., ttl=30.0) -> ttl_ms(30.0)
RESERVATION_MS = 250  # the default reservation=0.25 s
CHANNEL = f"{TABLE_PREFIX}released"  # PostgresState's NOTIFY channel
DEDUPE_TTL = 600.0  # Deduper's default ttl
DEDUPE_NAMESPACE = "dedupe"  # Deduper's default namespace
DUPLICATE_IDS = 100
WARMUP = 30

WORKERS = 16
PROCESSES = 3
TASKS_PER_PROCESS = 4

BACKENDS = ("postgres", "mysql", "redis")
LABEL = {"postgres": "PostgreSQL", "mysql": "MariaDB", "redis": "Redis"}

# -- the statements, as the states load them ---------------------------------------------------

_BLOCK = re.compile(r"^-- ([a-z_][a-z0-9_]*) --[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def load_statements(backend: str) -> dict[str, str]:
    """The named statements of ``asynclock/state/<backend>/queries.sql``, table prefix applied.

    The same reading as ``asynclock.state._sql.load_queries`` (a ``-- name --`` line, comment
    lines, then the statement), done here so the floor depends only on the SQL file.
    """
    text = resources.files(f"asynclock.state.{backend}").joinpath("queries.sql")
    blocks = _BLOCK.split(text.read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
        lines = [line for line in body.strip("\n").splitlines() if not line.startswith("--")]
        out[name] = "\n".join(lines).strip().rstrip(";").replace("{prefix}", TABLE_PREFIX)
    return out


def dollar(text: str) -> tuple[str, tuple[str, ...]]:
    """``%(name)s`` placeholders to asyncpg's ``$1, $2, ...`` (a repeated name keeps its number)."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PLACEHOLDER.sub(number, text), tuple(order)


def key_id(full_key: str) -> bytes:
    """The states' primary key of a prefixed key: its SHA-256."""
    return hashlib.sha256(full_key.encode("utf-8", "surrogatepass")).digest()


def owner_base() -> str:
    """``<host>:<pid>:<task>``: an asynclock owner id is this plus ``:<16 hex digits>``."""
    host = re.sub(r"[\s|]", "_", socket.gethostname()) or "localhost"
    return f"{host}:{os.getpid()}:{id(asyncio.current_task()):x}"


def mysql_options(url: str) -> dict[str, Any]:
    """aiomysql.connect() options as ``MySQLState.from_url`` builds them."""
    parts = urlsplit(url)
    return {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "db": unquote(parts.path.lstrip("/")),
        "charset": "utf8mb4",
        "autocommit": True,
        "client_flag": _client_found_rows(),
        "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
    }


def _client_found_rows() -> int:
    from pymysql.constants import CLIENT  # type: ignore[import-untyped]

    return int(CLIENT.FOUND_ROWS)


async def pg_connect(url: str, synchronous_commit: str | None = "off") -> Any:
    """An asyncpg connection with PostgresState.from_url's session settings.

    ``synchronous_commit=None`` keeps the server's setting.
    """
    import asyncpg  # type: ignore[import-untyped]

    settings = {"application_name": "asynclock-bench"}
    if synchronous_commit is not None:
        settings["synchronous_commit"] = synchronous_commit
    return await asyncpg.connect(dsn=url, timeout=5.0, server_settings=settings)


def pg_state_commit(api: Asynclock | str) -> str | None:
    """The ``synchronous_commit`` of PostgresState.from_url's connections by default.

    ``None`` (the server's setting) when ``from_url`` has a ``durable`` option that defaults to
    True; ``"off"`` when it has none (the state then sets ``off`` itself).
    """
    if isinstance(api, str):
        return "off"
    try:
        durable = inspect.signature(api.module.PostgresState.from_url).parameters.get("durable")
    except (AttributeError, TypeError, ValueError):
        return "off"
    if durable is None or durable.default is not True:
        return "off"
    return None


def pg_supports_durable(api: Asynclock) -> bool:
    """Whether PostgresState.from_url takes ``durable`` (``False``: ``synchronous_commit=off``)."""
    return pg_state_commit(api) is None


def commit_label(synchronous_commit: str | None) -> str:
    if synchronous_commit is None:
        return "the server's synchronous_commit"
    return f"synchronous_commit={synchronous_commit}"


async def mysql_connect(url: str) -> Any:
    """An aiomysql connection with MySQLState.from_url's options and session settings."""
    import aiomysql  # type: ignore[import-untyped]

    conn = await aiomysql.connect(connect_timeout=5.0, **mysql_options(url))
    cursor = await conn.cursor()
    await cursor.execute("SET SESSION innodb_lock_wait_timeout = 5, SESSION sql_notes = 0")
    await cursor.close()
    return conn


# -- variants ------------------------------------------------------------------------------------


class Variant:
    """One row of a table: ``setup`` once, ``loop(n)`` per round (timed), ``teardown`` once."""

    name = ""
    backend = ""
    #: ratio tag -> the variant (of the same round) this one is divided by
    refs: dict[str, str]

    def __init__(self) -> None:
        self.refs = {}

    async def setup(self) -> None:
        pass

    async def loop(self, n: int) -> None:
        raise NotImplementedError

    async def before_round(self) -> None:
        """Untimed, before each timed ``loop``."""

    async def after_round(self) -> None:
        """Untimed, after each timed ``loop``."""

    async def teardown(self) -> None:
        pass


class PgSelect(Variant):
    backend = "postgres"

    def __init__(self) -> None:
        super().__init__()
        self.name = "PostgreSQL floor: 2 x `SELECT 1` (asyncpg)"
        self.conn: Any = None

    async def setup(self) -> None:
        self.conn = await pg_connect(PG_URL)

    async def loop(self, n: int) -> None:
        fetchval = self.conn.fetchval
        for _ in range(n):
            await fetchval("SELECT 1")
            await fetchval("SELECT 1")

    async def teardown(self) -> None:
        await self.conn.close()


class PgRaw(Variant):
    """PostgresState's ``acquire`` + ``release`` statements on one asyncpg connection."""

    backend = "postgres"

    def __init__(self, prefix: str, key: str, synchronous_commit: str | None) -> None:
        super().__init__()
        self.name = "PostgreSQL raw floor: state's acquire + release statements, " + commit_label(
            synchronous_commit
        )
        self.sync = synchronous_commit
        self.full = prefix + key
        self.conn: Any = None
        stmts = load_statements("postgres")
        self.acquire_sql, self.acquire_names = dollar(stmts["acquire"])
        self.release_sql, self.release_names = dollar(stmts["release"])

    async def setup(self) -> None:
        self.conn = await pg_connect(PG_URL, self.sync)

    async def loop(self, n: int) -> None:
        fetch, ident, full = self.conn.fetch, key_id(self.full), self.full
        base, misses = owner_base(), 0
        for _ in range(n):
            owner = f"{base}:{secrets.token_hex(8)}"
            acquire = {
                "id": ident,
                "name": full,
                "owner": owner,
                "mark": f"\n{owner}\n",
                "ttl_ms": TTL_MS,
                "waiter": None,
            }
            rows = await fetch(self.acquire_sql, *[acquire[k] for k in self.acquire_names])
            if not isinstance(rows[0][0], int):
                misses += 1
            release = {
                "id": ident,
                "owner": owner,
                "successor": None,
                "successor_mark": None,
                "successor_ttl_ms": 0,
                "reservation_ms": RESERVATION_MS,
                "channel": CHANNEL,
                "payload": ident.hex(),
            }
            if not await fetch(self.release_sql, *[release[k] for k in self.release_names]):
                misses += 1
        if misses:
            raise RuntimeError(f"{self.name}: {misses} failed acquires/releases")

    async def teardown(self) -> None:
        await self.conn.close()


class MySelect(Variant):
    backend = "mysql"

    def __init__(self) -> None:
        super().__init__()
        self.name = "MariaDB floor: 2 x `SELECT 1` (aiomysql)"
        self.conn: Any = None

    async def setup(self) -> None:
        self.conn = await mysql_connect(MYSQL_URL)

    async def loop(self, n: int) -> None:
        cursor = await self.conn.cursor()
        for _ in range(n):
            await cursor.execute("SELECT 1")
            await cursor.fetchall()
            await cursor.execute("SELECT 1")
            await cursor.fetchall()
        await cursor.close()

    async def teardown(self) -> None:
        self.conn.close()


class MyRaw(Variant):
    """MySQLState's ``acquire`` + ``release`` statements on one aiomysql connection."""

    backend = "mysql"

    def __init__(self, prefix: str, key: str) -> None:
        super().__init__()
        self.name = "MariaDB raw floor: state's acquire + release statements"
        self.full = prefix + key
        self.conn: Any = None
        stmts = load_statements("mysql")
        self.acquire_sql, self.release_sql = stmts["acquire"], stmts["release"]

    async def setup(self) -> None:
        self.conn = await mysql_connect(MYSQL_URL)

    async def loop(self, n: int) -> None:
        cursor = await self.conn.cursor()
        ident, full = key_id(self.full).hex(), self.full
        base, misses = owner_base(), 0
        for _ in range(n):
            owner = f"{base}:{secrets.token_hex(8)}"
            await cursor.execute(
                self.acquire_sql,
                {
                    "id": ident,
                    "name": full,
                    "owner": owner,
                    "mark": f"\n{owner}\n",
                    "ttl_ms": TTL_MS,
                    "waiter": None,
                },
            )
            if (cursor.lastrowid or 0) < 10**15:
                misses += 1
            await cursor.execute(
                self.release_sql,
                {
                    "id": ident,
                    "owner": owner,
                    "successor": None,
                    "successor_mark": None,
                    "successor_ttl_ms": 0,
                    "reservation_ms": RESERVATION_MS,
                },
            )
            if cursor.rowcount != 1:
                misses += 1
        await cursor.close()
        if misses:
            raise RuntimeError(f"{self.name}: {misses} failed acquires/releases")

    async def teardown(self) -> None:
        self.conn.close()


class RedisRaw(Variant):
    backend = "redis"

    def __init__(self, url: str, key: str) -> None:
        super().__init__()
        self.name = "Redis raw floor: redis.asyncio SET NX PX + EVALSHA"
        self.client = redis.asyncio.Redis.from_url(url)
        self.key, self.sha = key, ""

    async def setup(self) -> None:
        self.sha = await self.client.script_load(RELEASE_SCRIPT)

    async def loop(self, n: int) -> None:
        set_ = cast("Callable[..., Awaitable[Any]]", self.client.set)
        evalsha = cast("Callable[..., Awaitable[Any]]", self.client.evalsha)
        key, sha, misses = self.key, self.sha, 0
        for i in range(n):
            token = f"t{i}"
            if not await set_(key, token, nx=True, px=TTL_MS):
                misses += 1
            if not await evalsha(sha, 1, key, token):
                misses += 1
        if misses:
            raise RuntimeError(f"{self.name}: {misses} failed acquires/releases")

    async def teardown(self) -> None:
        await self.client.aclose()


class StateVariant(Variant):
    """Opens an asynclock state of ``backend`` in setup, closes it in teardown."""

    def __init__(
        self, api: Asynclock, backend: str, url: str, prefix: str, key: str, **options: Any
    ) -> None:
        super().__init__()
        self.api, self.backend, self.url, self.prefix, self.key = api, backend, url, prefix, key
        self.options = options
        self.state: Any = None

    async def setup(self) -> None:
        # No watch(): a state that never waited has no LISTEN connection (PostgreSQL); a
        # listening one receives every release NOTIFY of the table (see AsynclockListening).
        self.state = _sql_procs.open_state(
            self.api, self.backend, self.url, self.prefix, **self.options
        )

    async def teardown(self) -> None:
        if self.state is not None:
            await self.state.aclose()
            self.state = None


class AsynclockPairs(StateVariant):
    def __init__(
        self, api: Asynclock, backend: str, url: str, prefix: str, key: str, **options: Any
    ) -> None:
        super().__init__(api, backend, url, prefix, key, **options)
        shown = "".join(f", {k}={v!r}" for k, v in options.items())
        cls = _sql_procs.STATE_CLASSES[backend]
        self.name = f"**asynclock** `async with AsyncLock` ({cls}{shown})"

    async def loop(self, n: int) -> None:
        lock_cls, state, key = self.api.lock_factory(), self.state, self.key
        for _ in range(n):
            async with lock_cls(state, key, ttl=30.0):
                pass


class AsynclockListening(AsynclockPairs):
    """PostgresState whose LISTEN connection is open (it has waited once), fresh every round.

    Opened and closed outside the timed loop, so that its listener hears only the NOTIFYs sent
    while it is timed (its own, and other clients' of the same tables), not other rows'.
    """

    def __init__(self, api: Asynclock, url: str, prefix: str, key: str) -> None:
        super().__init__(api, "postgres", url, prefix, key)
        self.name = "**asynclock** `async with AsyncLock` (PostgresState, LISTEN connection open)"

    async def setup(self) -> None:
        await self.before_round()

    async def before_round(self) -> None:
        await self.teardown()
        await super().setup()
        await _sql_procs.warm_state(self.state, self.key)
        await self.loop(10)

    async def after_round(self) -> None:
        await self.teardown()


# -- dedupe ----------------------------------------------------------------------------------------


class DedupeAsynclock(StateVariant):
    def __init__(
        self, api: Asynclock, backend: str, url: str, prefix: str, tag: str, duplicate: bool
    ) -> None:
        super().__init__(api, backend, url, prefix, tag)
        what = "duplicates" if duplicate else "new ids"
        self.name = f"**asynclock** `Deduper.first_seen`, {what} ({LABEL[backend]})"
        self.tag, self.duplicate, self.seq = tag, duplicate, 0
        self.deduper: Any = None

    async def setup(self) -> None:
        await super().setup()
        self.deduper = self.api.module.Deduper(self.state, ttl=DEDUPE_TTL)
        if self.duplicate:
            for i in range(DUPLICATE_IDS):
                await self.deduper.first_seen(f"{self.tag}:{i}")

    async def loop(self, n: int) -> None:
        first_seen, tag, wrong = self.deduper.first_seen, self.tag, 0
        if self.duplicate:
            for i in range(n):
                if await first_seen(f"{tag}:{i % DUPLICATE_IDS}"):
                    wrong += 1
        else:
            start, self.seq = self.seq, self.seq + n
            for i in range(start, start + n):
                if not await first_seen(f"{tag}:{i}"):
                    wrong += 1
        if wrong:
            raise RuntimeError(f"{self.name}: {wrong} wrong answers")


class DedupeRaw(Variant):
    """The state's ``dedupe_add`` statement on one connection, parameters as the state's."""

    def __init__(
        self, backend: str, prefix: str, tag: str, duplicate: bool, commit: str | None
    ) -> None:
        super().__init__()
        self.commit = commit
        self.backend, self.tag, self.duplicate, self.seq = backend, tag, duplicate, 0
        what = "duplicates" if duplicate else "new ids"
        self.name = f"{LABEL[backend]} raw floor: state's dedupe_add statement, {what}"
        self.base = f"{prefix}{DEDUPE_NAMESPACE}:{tag}:"
        sql = load_statements(backend)["dedupe_add"]
        self.sql, self.names = dollar(sql) if backend == "postgres" else (sql, ())
        self.conn: Any = None
        self.ttl_ms = round(DEDUPE_TTL * 1000)

    async def setup(self) -> None:
        if self.backend == "postgres":
            self.conn = await pg_connect(PG_URL, self.commit)
        else:
            self.conn = await mysql_connect(MYSQL_URL)
        if self.duplicate:
            await self._run(0, DUPLICATE_IDS)

    async def _run(self, start: int, n: int, *, modulo: int = 0) -> int:
        """``dedupe_add`` of ids ``start .. start+n`` (mod ``modulo``); returns how many claimed."""
        claimed, base, ttl = 0, self.base, self.ttl_ms
        if self.backend == "postgres":
            fetch, sql, names = self.conn.fetch, self.sql, self.names
            for i in range(start, start + n):
                full = f"{base}{i % modulo if modulo else i}"
                params = {"id": key_id(full), "name": full, "ttl_ms": ttl}
                if await fetch(sql, *[params[k] for k in names]):
                    claimed += 1
            return claimed
        cursor = await self.conn.cursor()
        for i in range(start, start + n):
            full = f"{base}{i % modulo if modulo else i}"
            await cursor.execute(self.sql, {"id": key_id(full).hex(), "name": full, "ttl_ms": ttl})
            if (cursor.lastrowid or 0) > 0:
                claimed += 1
        await cursor.close()
        return claimed

    async def loop(self, n: int) -> None:
        if self.duplicate:
            wrong = await self._run(0, n, modulo=DUPLICATE_IDS)
        else:
            start, self.seq = self.seq, self.seq + n
            wrong = n - await self._run(start, n)
        if wrong:
            raise RuntimeError(f"{self.name}: {wrong} wrong answers")

    async def teardown(self) -> None:
        if self.backend == "postgres":
            await self.conn.close()
        else:
            self.conn.close()


# -- running interleaved rounds ------------------------------------------------------------------


async def _setup_all(variants: list[Variant], rounds: Rounds, part: str) -> list[Variant]:
    live: list[Variant] = []
    for variant in variants:
        rounds.declare(variant.name)
        try:
            await variant.setup()
            await variant.loop(WARMUP)
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            rounds.skip(variant.name, f"{type(exc).__name__}: {exc}".splitlines()[0])
            log(f"sql {part}: {variant.name} skipped: {exc!r}")
            await _teardown(variant)
        else:
            live.append(variant)
    return live


async def _teardown(variant: Variant) -> None:
    try:
        await variant.teardown()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"sql: teardown of {variant.name} failed: {exc!r}")


async def _interleave(
    variants: list[Variant], rounds: Rounds, n: int, rounds_n: int, part: str, unit: str
) -> None:
    live = await _setup_all(variants, rounds, part)
    try:
        for r in range(rounds_n):
            per_round: dict[str, dict[str, float]] = {}
            shift = r % len(live) if live else 0
            for variant in live[shift:] + live[:shift]:
                try:
                    await variant.before_round()
                    gc.collect()
                    t0, c0 = time.perf_counter(), time.process_time()
                    await variant.loop(n)
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    await variant.after_round()
                except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                    rounds.skip(variant.name, f"{type(exc).__name__}: {exc}".splitlines()[0])
                    log(f"sql {part}: {variant.name} failed, dropped: {exc!r}")
                    live.remove(variant)
                    await _teardown(variant)
                    continue
                per_round[variant.name] = {
                    "rate": n / wall,
                    "us": wall / n * 1e6,
                    "cpu_us": cpu / n * 1e6,
                }
            for variant in live:
                metrics = per_round.get(variant.name)
                if metrics is None:
                    continue
                for tag, ref in variant.refs.items():
                    if ref in per_round:
                        metrics[f"x_{tag}"] = metrics["rate"] / per_round[ref]["rate"]
                rounds.add(variant.name, metrics)
            summary = ", ".join(f"{short(k)}: {m['rate']:,.0f}" for k, m in per_round.items())
            log(f"sql {part} round {r + 1}/{rounds_n} ({unit}): {summary}")
    finally:
        for variant in live:
            await _teardown(variant)


# -- contention ----------------------------------------------------------------------------------


@dataclass
class Contention:
    single: Rounds = field(default_factory=Rounds)
    multi: Rounds = field(default_factory=Rounds)


def _cycles(cfg: Config) -> tuple[int, int]:
    """Cycles per task: (16 tasks in one process, 3 processes x 4 tasks)."""
    return (30, 25) if cfg.quick else (100, 50)


def short(label: str) -> str:
    """A row's label for progress lines: no markdown."""
    return label.replace("**", "").replace("`", "").replace("asynclock async with AsyncLock", "lib")


def _single_name(backend: str) -> str:
    return f"**asynclock** {_sql_procs.STATE_CLASSES[backend]}, {WORKERS} tasks"


def _multi_name(backend: str) -> str:
    cls = _sql_procs.STATE_CLASSES[backend]
    return f"**asynclock** {cls}, {PROCESSES} processes x {TASKS_PER_PROCESS} tasks"


async def _contention(
    cfg: Config, api: Asynclock, prefix: str, urls: dict[str, str], rounds_n: int
) -> Contention:
    out = Contention()
    cycles, multi_cycles = _cycles(cfg)
    timeout = 60.0 if cfg.quick else 120.0
    states: dict[str, Any] = {}
    runners: dict[str, Callable[[], Awaitable[tuple[Any, str | None]]]] = {}
    lock_cls = api.lock_factory()

    for backend in BACKENDS:
        name = _single_name(backend)
        out.single.declare(name)
        key = f"{backend}:contended"
        try:
            state = _sql_procs.open_state(api, backend, urls[backend], prefix)
            states[backend] = state
            await _sql_procs.warm_state(state, key)
            contender = _sql_procs.LockContender(lock_cls, state, key)
            warm = await contend(contender, workers=WORKERS, cycles=2, timeout=30)
            if warm.timed_out:
                raise RuntimeError("warm-up (16 tasks x 2 cycles) timed out")
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            out.single.skip(name, f"{type(exc).__name__}: {exc}".splitlines()[0])
            log(f"sql contended: {name} skipped: {exc!r}")
            continue

        def single(contender: Any = contender) -> Awaitable[tuple[Any, str | None]]:
            async def go() -> tuple[Any, str | None]:
                outcome = await contend(contender, workers=WORKERS, cycles=cycles, timeout=timeout)
                return outcome, None

            return go()

        runners[name] = single

    for backend in BACKENDS:
        name = _multi_name(backend)
        out.multi.declare(name)
        if backend not in states:
            out.multi.skip(name, "the backend failed in the single-process rows")
            continue

        def multi(backend: str = backend) -> Awaitable[tuple[Any, str | None]]:
            async def go() -> tuple[Any, str | None]:
                return _sql_procs.run_processes(
                    backend=backend,
                    url=urls[backend],
                    prefix=prefix,
                    key=f"{backend}:procs",
                    processes=PROCESSES,
                    tasks=TASKS_PER_PROCESS,
                    cycles=multi_cycles,
                    timeout=timeout,
                )

            return go()

        runners[name] = multi

    names = list(runners)
    try:
        for r in range(rounds_n):
            if not names:
                break
            done: list[str] = []
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                target = out.multi if "processes" in name else out.single
                workers = PROCESSES * TASKS_PER_PROCESS if target is out.multi else WORKERS
                gc.collect()
                try:
                    outcome, error = await runners[name]()
                except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                    outcome, error = None, f"{type(exc).__name__}: {exc}"
                if outcome is None or outcome.timed_out:
                    reason = error or f"timed out after {timeout:.0f} s"
                    target.skip(name, reason.splitlines()[0])
                    log(f"sql contended: {name} round {r + 1} failed, dropped: {reason}")
                    names.remove(name)
                    continue
                metrics = analyze(
                    outcome.events,
                    workers=workers,
                    started=outcome.started,
                    counter_violations=outcome.counter_violations,
                )
                target.add(name, metrics)
                done.append(f"{short(name)}: {metrics['cycles_s']:,.0f}/s")
            log(f"sql contended round {r + 1}/{rounds_n}: {', '.join(done)}")
    finally:
        for state in states.values():
            try:
                await state.aclose()
            except Exception as exc:  # noqa: BLE001, PERF203 (reported, never fatal)
                log(f"sql contended: close failed: {exc!r}")
    return out


# -- server facts and clean-up ---------------------------------------------------------------------


async def pg_facts(url: str, commit: str | None) -> list[tuple[str, str]]:
    conn = await pg_connect(url, synchronous_commit=None)  # the server's own settings
    try:
        version = await conn.fetchval("SHOW server_version")
        rows = await conn.fetch(
            "SELECT name, setting, unit FROM pg_settings WHERE name = ANY($1::text[]) ORDER BY name",
            ["synchronous_commit", "fsync", "wal_sync_method", "commit_delay", "shared_buffers"],
        )
    finally:
        await conn.close()
    settings = ", ".join(
        f"{r['name']}={r['setting']}{' x ' + r['unit'] if r['unit'] else ''}" for r in rows
    )
    return [
        ("PostgreSQL server", f"{version} at `{_redact(url)}`"),
        ("PostgreSQL server settings (pg_settings)", settings),
        ("PostgreSQL session settings", pg_session_text(commit)),
    ]


def pg_session_text(commit: str | None) -> str:
    if commit is None:
        return (
            "PostgresState.from_url (default `durable=True`) keeps the server's "
            "`synchronous_commit`; `durable=False` sets `off`. The raw floor runs with each "
            "setting, and every asynclock row is divided by the floor with its own setting"
        )
    return (
        "PostgresState.from_url sets `synchronous_commit=off` on its connections; the raw "
        "floor runs with the same, and once more with the server's setting for scale"
    )


async def mysql_facts(url: str) -> list[tuple[str, str]]:
    conn = await mysql_connect(url)
    try:
        cursor = await conn.cursor()
        await cursor.execute("SELECT VERSION()")
        (version,) = (await cursor.fetchall())[0]
        await cursor.execute(
            "SHOW GLOBAL VARIABLES WHERE Variable_name IN ('innodb_flush_log_at_trx_commit', "
            "'sync_binlog', 'log_bin', 'innodb_doublewrite', 'innodb_flush_method', "
            "'tx_isolation', 'transaction_isolation', 'innodb_buffer_pool_size')"
        )
        rows = await cursor.fetchall()
        await cursor.close()
    finally:
        conn.close()
    settings = ", ".join(f"{name}={value}" for name, value in sorted(rows))
    return [
        ("MariaDB/MySQL server", f"{version} at `{_redact(url)}`"),
        ("MariaDB/MySQL global variables", settings),
        (
            "MariaDB/MySQL session settings",
            (
                "MySQLState.from_url: autocommit, `READ COMMITTED`, `CLIENT_FOUND_ROWS`, "
                "utf8mb4, `innodb_lock_wait_timeout=5`, `sql_notes=0`; the raw floor uses the same"
            ),
        ),
    ]


async def _cleanup(prefix: str) -> str:
    """Delete this run's rows (locks and dedupe records under ``prefix``) from both databases."""
    pattern = prefix + "%"
    done: list[str] = []
    try:
        conn = await pg_connect(PG_URL)
        try:
            for tbl in ("locks", "dedupe"):
                status = await conn.execute(
                    f"DELETE FROM {TABLE_PREFIX}{tbl} WHERE name LIKE $1", pattern
                )
                done.append(f"PostgreSQL {tbl}: {status.rsplit(' ', 1)[-1]}")
        finally:
            await conn.close()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        done.append(f"PostgreSQL clean-up failed: {exc!r}")
    try:
        my = await mysql_connect(MYSQL_URL)
        try:
            cursor = await my.cursor()
            for tbl in ("locks", "dedupe"):
                await cursor.execute(
                    f"DELETE FROM {TABLE_PREFIX}{tbl} WHERE name LIKE %(p)s", {"p": pattern}
                )
                done.append(f"MariaDB {tbl}: {cursor.rowcount}")
            await cursor.close()
        finally:
            my.close()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        done.append(f"MariaDB clean-up failed: {exc!r}")
    return ", ".join(done)


# -- the scenario ----------------------------------------------------------------------------------


async def run(cfg: Config, api: Asynclock | str) -> Section:
    started = now_utc()
    t0 = time.monotonic()
    prefix = f"{KEY_ROOT}:{cfg.run_id}:"  # the states' key prefix; every row of this run has it
    urls = {"postgres": PG_URL, "mysql": MYSQL_URL, "redis": cfg.url}
    # many short rounds: a burst of other load on the shared machine hits one short round of
    # a few variants, and the median over the rounds leaves it out
    rounds_n = cfg.rounds_or(15, 4)
    n = 400 if cfg.quick else 700
    facts = await _general_facts(cfg, api)
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
            await _interleave(variants, uncontended, n, rounds_n, "uncontended", "pairs/s")
            contention = await _contention(cfg, api, prefix, urls, cfg.rounds_or(5, 3))
            dedupe_variants = _dedupe_variants(api, prefix)
            await _interleave(dedupe_variants, dedupe, n, rounds_n, "dedupe", "ops/s")
    finally:
        cleaned = await _cleanup(prefix)
        log(f"sql: deleted this run's rows: {cleaned}")
    kind = "quick" if cfg.quick else "full"
    took = time.monotonic() - t0
    facts.append(("run", f"{cfg.run_id}, {kind}, {took:.0f} s, started {started}"))
    return _section(cfg, commit, facts, uncontended, contention, dedupe, n, rounds_n)


async def _general_facts(cfg: Config, api: Asynclock | str) -> list[tuple[str, str]]:
    """Machine, Python, asynclock and Redis facts from the harness's own list."""
    client = redis.asyncio.Redis.from_url(cfg.url)
    try:
        general = await environment_facts(client, cfg.url, api)
    finally:
        await client.aclose()
    wanted = {"machine", "python", "event loop", "asynclock", "redis-server"}
    out = [(k, v) for k, v in general if k in wanted]
    return [*out, ("Redis server URL", _redact(cfg.url))]


def _drivers() -> str:
    return ", ".join(
        f"{name} {_dist_version(name)}" for name in ("asyncpg", "aiomysql", "PyMySQL", "redis")
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
    rd_raw = RedisRaw(cfg.url, prefix + "redis:raw")
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
    single_cols = [
        Column("cycles/s", "cycles_s"),
        Column("cross-worker handoff p50 ms", "xh_p50", 3),
        Column("cross-worker handoff p99 ms", "xh_p99", 3),
        Column("acquire wait p99 ms", "w_p99", 1),
        Column("acquire wait max ms", "w_max", 1),
        Column("longest same-worker streak", "streak"),
        Column("counter violations", "violations"),
        Column("interval overlaps", "overlaps"),
        Column("cycles / run", "cycles"),
    ]
    multi_cols = [
        Column("cycles/s", "cycles_s"),
        Column("cross-process handoff p50 ms", "xg_p50", 3),
        Column("cross-process handoff p99 ms", "xg_p99", 3),
        Column("cross-process handoffs / run", "xg_count"),
        Column("cross-worker handoff p50 ms", "xh_p50", 3),
        Column("cross-worker handoff p99 ms", "xh_p99", 3),
        Column("acquire wait max ms", "w_max", 1),
        Column("counter violations", "violations"),
        Column("interval overlaps", "overlaps"),
        Column("cycles / run", "cycles"),
    ]
    dedupe_cols = [
        Column("ops/s", "rate"),
        Column("µs per op", "us"),
        Column("client CPU µs per op", "cpu_us"),
        Column("÷ raw floor (same statement, same ids)", "x_raw", 2),
    ]
    multi_cycles = _cycles(cfg)[1]
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
        "What each row runs:",
        (
            "- **asynclock**: `async with AsyncLock(state, key, ttl=30.0): pass` (a new lock "
            "object per pair) on a state from `from_url(url, prefix=...)`: acquire is one "
            "`acquire` statement, release one `release` statement, each in autocommit."
        ),
        (
            "- **PostgreSQL raw floor**: the `acquire` and `release` statements of "
            "`asynclock/state/postgres/queries.sql`, placeholders numbered as the state numbers "
            "them, sent with `asyncpg.Connection.fetch` on one autocommit connection with "
            "PostgresState's session settings (see `synchronous_commit` below); parameters as "
            "PostgresState passes them for an uncontended pair: key id = SHA-256 of the "
            "prefixed key, a fresh owner id per pair (`<host>:<pid>:<task>:<16 hex>`, mark "
            "`\\n<owner>\\n`), `ttl_ms=30000`, `waiter=NULL`; release with `successor=NULL`, "
            "`successor_mark=NULL`, `successor_ttl_ms=0`, `reservation_ms=250`, channel "
            "`asynclock_released`, payload = key id in hex (so it NOTIFYs, as the state's "
            "release does). The lock row stays after release, so every acquire after the first "
            "is the `ON CONFLICT DO UPDATE` path, as for the state. Checked: every acquire "
            "returns a token, every release a row."
        ),
        (
            "- the floor runs once with the server's `synchronous_commit` (`on`: each commit "
            "waits for its WAL flush) and once with `off` (it does not). Each asynclock row's "
            "ratio is taken against the floor with the same setting: "
            + pg_session_text(commit)
            + "."
        ),
        (
            "- **MariaDB raw floor**: the `acquire` and `release` statements of "
            "`asynclock/state/mysql/queries.sql` via `aiomysql` `cursor.execute(sql, params)` "
            "on one connection opened with MySQLState's options (utf8mb4, autocommit, "
            "`CLIENT_FOUND_ROWS`, `READ COMMITTED`, `innodb_lock_wait_timeout=5`, "
            "`sql_notes=0`); parameters as MySQLState passes them: key id = SHA-256 hex (the "
            "statement UNHEXes it), fresh owner per pair, `ttl_ms=30000`, `waiter=NULL`; "
            "release with `successor=NULL`, `successor_mark=NULL`, `successor_ttl_ms=0`, "
            "`reservation_ms=250`. Checked: `lastrowid` >= 10^15 (a token) after every acquire, "
            "`rowcount` 1 after every release."
        ),
        (
            "- **2 x SELECT 1**: two round trips that touch no table and commit nothing, on one "
            "connection of the same driver: what any two-statement lock pair pays at least."
        ),
        (
            "- **Redis raw floor**: `SET key token NX PX 30000` + `EVALSHA` compare-and-delete "
            "on one redis.asyncio client, as in the `uncontended` scenario, with the RedisState "
            "row, for scale across backends (same run, same machine)."
        ),
        "- client CPU is `time.process_time()` over the timed loop (the whole process).",
        "",
        f"### Contended: {WORKERS} tasks x {_cycles(cfg)[0]} cycles on one key, one process",
        "",
        table(contention.single, single_cols),
        "",
        (
            f"### {PROCESSES} processes x {TASKS_PER_PROCESS} tasks x {multi_cycles} cycles on "
            "one key (multiprocessing, spawn)"
        ),
        "",
        (
            "Each child opens its own state, warms up on its own key (its PostgreSQL LISTEN "
            "connection included), reports ready, and all start on one signal; the parent "
            "merges their timestamped cycles."
        ),
        "",
        table(contention.multi, multi_cols),
        "",
        "Definitions (as in `shared/research/peer-lock-benchmarks.md` and `contended`):",
        (
            "- **handoff**: the next successful `acquire()` return minus the moment the previous "
            "holder left its critical section (just before `release()`), so it includes the "
            "release statement. **Cross-worker** leaves out a task re-taking the lock it just "
            "released; **cross-process** counts only handoffs to a task of another process."
        ),
        "- **acquire wait**: from the `acquire()` call to its return.",
        (
            "- the critical section increments an in-section counter, yields once "
            "(`await asyncio.sleep(0)`) and decrements it; above 1 is a violation. Interval "
            "overlaps: [acquired, left] intervals of different cycles that overlap on the merged "
            "timeline (perf_counter, CLOCK_MONOTONIC). Both must be 0."
        ),
        (
            "- Within one process, waiters queue in the state's FIFO line and a release hands "
            "the lock to the next one in the same statement. Across processes PostgreSQL wakes "
            "a waiting process by LISTEN/NOTIFY (the release NOTIFYs in its own transaction); "
            "MySQL has no NOTIFY: **a waiting process blocks in `GET_LOCK` of the key's wake "
            "name, which the holder's state holds on a connection of its own and frees after "
            "the release** (from the second handoff of a key on; the first one, and any the "
            "push misses, re-check after a back-off of 5 ms doubling to 100 ms, bounded by the "
            "holder's remaining TTL). Redis uses pub/sub."
        ),
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
        (
            "- asynclock: `Deduper(state, ttl=600.0).first_seen(event_id)` on a state from "
            "`from_url`; one `dedupe_add` statement per call."
        ),
        (
            "- raw floor: the state's `dedupe_add` statement on one connection of the same "
            "driver with the state's session settings, parameters as the state passes them "
            "(id = SHA-256 of `<prefix>dedupe:<event id>`, name, `ttl_ms=600000`); checked: "
            "new ids claimed (PostgreSQL: a row back; MySQL: `lastrowid` > 0), duplicates not."
        ),
        (
            f"- Rows are written under the key prefix `{KEY_ROOT}:<run id>:` in the default "
            "tables and deleted at the end of the run."
        ),
    ]
    headlines: list[tuple[str, str]] = []

    def add(label: str, rounds: Rounds, variant: str, metric: str, digits: int) -> None:
        spread = rounds.spread(variant, metric)
        if spread.count == 0:
            headlines.append((label, "n/a (skipped: see the tables)"))
        else:
            headlines.append((label, f"**{fmt_spread(spread, digits)}**"))

    for backend in ("postgres", "mysql"):
        cls = _sql_procs.STATE_CLASSES[backend]
        lib = f"**asynclock** `async with AsyncLock` ({cls})"
        rate = pairs.spread(lib, "rate")
        setting = f", {commit_label(commit)}" if backend == "postgres" else ""
        label = f"{cls} uncontended pair ÷ raw floor of its statements{setting}"
        add(label, pairs, lib, "x_raw", 2)
        headlines[-1] = (headlines[-1][0], headlines[-1][1] + f" ({fmt(rate.median, 0)} pairs/s)")
        fast = f"**asynclock** `async with AsyncLock` ({cls}, durable=False)"
        if fast in pairs.variants:
            label = f"{cls}(durable=False) uncontended pair ÷ raw floor, synchronous_commit=off"
            add(label, pairs, fast, "x_raw", 2)
            rate = pairs.spread(fast, "rate")
            headlines[-1] = (
                headlines[-1][0],
                headlines[-1][1] + f" ({fmt(rate.median, 0)} pairs/s)",
            )
        add(f"{cls} uncontended pair ÷ 2 x SELECT 1", pairs, lib, "x_select", 2)
        add(f"{cls} 16 tasks: cross-worker handoff p50 ms", contention.single,
            _single_name(backend), "xh_p50", 3)  # fmt: skip
        add(f"{cls} 16 tasks: cross-worker handoff p99 ms", contention.single,
            _single_name(backend), "xh_p99", 3)  # fmt: skip
        add(f"{cls} 3 processes: cross-process handoff p50 ms", contention.multi,
            _multi_name(backend), "xg_p50", 3)  # fmt: skip
        add(f"{cls} 3 processes: cross-process handoff p99 ms", contention.multi,
            _multi_name(backend), "xg_p99", 3)  # fmt: skip
        for dup in (False, True):
            what = "duplicates" if dup else "new ids"
            name = f"**asynclock** `Deduper.first_seen`, {what} ({LABEL[backend]})"
            add(f"{cls} Deduper.first_seen {what} ÷ raw statement", dedupe, name, "x_raw", 2)
    violations = [
        int(m.get("violations", 0) + m.get("overlaps", 0))
        for r in (contention.single, contention.multi)
        for v in r.variants
        for m in r.data[v]
    ]
    headlines.append(
        ("SQL mutual-exclusion violations, all variants and rounds", fmt(float(sum(violations)), 0))
    )
    return Section("sql", "\n".join(body), headlines)
