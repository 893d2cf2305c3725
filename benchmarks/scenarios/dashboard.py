"""Scenario ``dashboard``: what one refresh of the web dashboard costs the state (#28).

A refresh is one ``GET /api/refresh`` of ``asynclock.web.dashboard`` through its ASGI app, as an
open page's poll reaches it: one ``inbox_keys()``, one walk of ``held_locks()``, and the dead
letters of the keys on the page (at most 10). The state holds N keys with work (one pending
event each, no worker), 10 keys with one dead letter and 10 locks held; N = 10, 100 and 1,000.
The work is counted **on the server**:

* Redis: a private throwaway ``redis-server`` (the run's own commands only), ``INFO
  commandstats`` before and after one refresh of a warm state, by command;
* PostgreSQL: a database of the run's own, ``xact_commit + xact_rollback`` of
  ``pg_stat_database`` (every operation of PostgresState is one statement in autocommit: one
  transaction each);
* MariaDB: a database and a user of the run's own, ``SELECT_COMMANDS + UPDATE_COMMANDS +
  OTHER_COMMANDS`` of ``information_schema.USER_STATISTICS`` (``userstat`` is switched on for the
  run, and back to what it was).

The SQL servers publish a backend's counts when its connection ends, so each figure there is
the difference of two runs from a fresh state to its ``aclose()``: two refreshes minus one.
Beside every refresh: the **floor**, the same data read the way ``asynclock inbox`` and
``asynclock locks`` read it (``inbox_keys()`` and ``held_locks()`` alone), and the refresh's
wall time (a loaded 2-core machine: a hint, not a measure).
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import secrets
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio

from benchmarks.harness.env import log
from benchmarks.harness.report import Section, kept, kv_table
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.servers import PrivateServer
from benchmarks.harness.sql_server import MYSQL_URL, PG_URL, mysql_options

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from typing_extensions import Self

    from benchmarks.harness.env import Asynclock, Config

SIZES = (10, 100, 1000)
DEAD_KEYS = 10
HELD_LOCKS = 10
#: keys of another application in the same Redis database, for the last Redis row
OTHER_KEYS = 100_000
DATABASE = "asynclock_bench_dashboard"
USER = "asynclock_bench"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


async def _refresh(state: Any) -> float:
    """One refresh of a new dashboard of ``state`` (nothing cached); its wall time."""
    import httpx

    web = importlib.import_module("asynclock.web")
    app = web.dashboard(state)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as http:
        started = time.perf_counter()
        answer = await http.get("/api/refresh")
        elapsed = time.perf_counter() - started
    if answer.status_code != 200 or "not answering" in answer.text:
        raise RuntimeError(f"the refresh failed: {answer.status_code} {answer.text[:300]}")
    return elapsed


async def _floor(state: Any) -> float:
    """What ``asynclock inbox`` + ``asynclock locks`` read: ``inbox_keys()``, ``held_locks()``."""
    started = time.perf_counter()
    await state.inbox_keys()
    [info async for info in state.held_locks()]
    return time.perf_counter() - started


async def _populate(api: Asynclock, url: str, have: int, want: int) -> None:
    """Keys with work ``have`` .. ``want - 1`` (one pending event each), by a state of its own
    that is closed afterwards (on SQL its counts are in before anything is measured)."""
    state = api.module.state_from_url(url, prefix="bench:")
    try:
        bot = api.module.EventDispatcher(state, on_lock_conflict="queue")
        event = api.module.Event
        for n in range(have, want):
            await bot.accept(event("message", "bench", "C", f"K{n:05d}", f"k{n}"))
    finally:
        await state.aclose()


async def _prepare(api: Asynclock, url: str) -> None:
    """:data:`DEAD_KEYS` keys with one dead letter each (a failing ``serve()``, one attempt),
    and :data:`HELD_LOCKS` locks held for ten minutes by a holder that is gone."""
    state = api.module.state_from_url(url, prefix="bench:")
    try:
        bot = api.module.EventDispatcher(state, on_lock_conflict="queue", max_attempts=1)

        async def fail(event: Any, ctx: Any) -> None:
            raise RuntimeError(f"bench: poison {event.message_id}")

        bot.on("*")(fail)

        for n in range(DEAD_KEYS):
            await bot.accept(api.module.Event("message", "bench", "C", f"D{n}", f"d{n}"))
        serving = asyncio.create_task(bot.serve())
        deadline = time.monotonic() + 60
        while sum(k.dead for k in await state.inbox_keys()) < DEAD_KEYS:
            if time.monotonic() > deadline:
                raise RuntimeError("the dead letters did not appear within 60 s")
            await asyncio.sleep(0.05)
        await bot.aclose()
        await serving
        for n in range(HELD_LOCKS):
            owner = f"bench-host:4242:{n:x}:{secrets.token_hex(8)}"
            grant = await state.acquire(f"held:{n}", owner, 600.0)
            if grant.token is None:
                raise RuntimeError(f"held:{n} is held already")
    finally:
        await state.aclose()


# --- Redis: a private server, INFO commandstats ------------------------------------------------


async def _commands(client: redis.asyncio.Redis) -> collections.Counter[str]:
    info = await client.info("commandstats")
    return collections.Counter(
        {name.removeprefix("cmdstat_"): int(stats["calls"]) for name, stats in info.items()}
    )


async def _counted(
    client: redis.asyncio.Redis, work: Callable[[], Awaitable[float]]
) -> tuple[collections.Counter[str], float]:
    before = await _commands(client)
    elapsed = await work()
    delta = await _commands(client) - before
    delta["info"] -= 1  # the reading before
    return +delta, elapsed


def _spelled(counts: collections.Counter[str]) -> str:
    total = sum(counts.values())
    parts = ", ".join(f"{name.upper()} {n:,}" for name, n in counts.most_common(4))
    return f"{total:,} ({parts})"


async def _redis_rows(
    api: Asynclock, url: str, client: redis.asyncio.Redis, rounds: int, label: str
) -> list[tuple[str, str]]:
    """The rows of one measurement on the private server, as it is now."""
    state = api.module.state_from_url(url, prefix="bench:")
    try:
        await _refresh(state)  # warm: scripts loaded, connections open
        ours = [await _counted(client, lambda: _refresh(state)) for _ in range(rounds)]
        base = [await _counted(client, lambda: _floor(state)) for _ in range(rounds)]
    finally:
        await state.aclose()
    commands, floor_commands = ours[-1][0], base[-1][0]
    ratio = sum(commands.values()) / max(sum(floor_commands.values()), 1)
    wall = _median([t for _, t in ours]) * 1000
    log(f"dashboard: {label}: {_spelled(commands)}, {wall:.0f} ms")
    return [
        (f"{label}: commands per refresh", _spelled(commands)),
        (f"{label}: floor (inbox_keys + held_locks)", _spelled(floor_commands)),
        (f"{label}: refresh / floor; wall time", f"{ratio:.2f}x; {wall:,.0f} ms"),
    ]


async def _redis(api: Asynclock, rounds: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    with PrivateServer() as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            await _prepare(api, server.url)
            have = 0
            for size in SIZES:
                await _populate(api, server.url, have, size)
                have = size
                label = f"Redis, {size:,} keys with work"
                rows += await _redis_rows(api, server.url, client, rounds, label)
            # both listings SCAN the database: other applications' keys are walked too
            for start in range(0, OTHER_KEYS, 1000):
                await client.mset({f"other-app:{n}": "x" for n in range(start, start + 1000)})
            label = f"Redis, {have:,} keys with work, {OTHER_KEYS:,} other keys in the database"
            rows += await _redis_rows(api, server.url, client, rounds, label)
        finally:
            await client.aclose()
    return rows


# --- PostgreSQL and MariaDB: the run's own database, counted by the server --------------------


def _with_database(url: str, database: str, user: str | None = None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        netloc = f"{user}@{netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, f"/{database}", parts.query, parts.fragment))


class _PgCounts:
    """Transactions of the run's database, read from another database of the server."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: Any = None

    async def __aenter__(self) -> Self:
        import asyncpg  # type: ignore[import-untyped]

        self.conn = await asyncpg.connect(self.url, statement_cache_size=0)
        await self.conn.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        await self.conn.execute(f"CREATE DATABASE {DATABASE}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.conn.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        await self.conn.close()

    async def read(self) -> int:
        value = await self.conn.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", DATABASE
        )
        return int(value)


class _MariaCounts:
    """Statements of the run's user (``userstat``), and the run's database."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conn: Any = None
        self.userstat = "OFF"

    async def _run(self, statement: str) -> list[Any]:
        async with self.conn.cursor() as cursor:
            await cursor.execute(statement)
            return list(await cursor.fetchall())

    async def __aenter__(self) -> Self:
        import aiomysql  # type: ignore[import-untyped]

        options = mysql_options(self.url)
        options.pop("db", None)
        self.conn = await aiomysql.connect(**{**options, "autocommit": True})
        self.userstat = (await self._run("SELECT @@GLOBAL.userstat"))[0][0]
        await self._run("SET GLOBAL userstat = ON")
        await self._run(f"DROP DATABASE IF EXISTS {DATABASE}")
        await self._run(f"CREATE DATABASE {DATABASE}")
        await self._run(f"CREATE USER IF NOT EXISTS '{USER}'@'127.0.0.1'")
        await self._run(f"GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'127.0.0.1'")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._run(f"DROP DATABASE IF EXISTS {DATABASE}")
        await self._run(f"DROP USER IF EXISTS '{USER}'@'127.0.0.1'")
        await self._run(f"SET GLOBAL userstat = {int(self.userstat in (1, '1', 'ON'))}")
        self.conn.close()

    async def read(self) -> int:
        rows = await self._run(
            "SELECT SELECT_COMMANDS + UPDATE_COMMANDS + OTHER_COMMANDS "
            f"FROM information_schema.USER_STATISTICS WHERE USER = '{USER}'"
        )
        return int(rows[0][0]) if rows else 0


async def _settled(counts: _PgCounts | _MariaCounts) -> int:
    """The count once the closed connections' figures are in (two equal reads, 50 ms apart)."""
    last = await counts.read()
    for _ in range(100):
        await asyncio.sleep(0.05)
        now = await counts.read()
        if now == last:
            return now
        last = now
    return last


async def _sql_cost(
    api: Asynclock,
    url: str,
    counts: _PgCounts | _MariaCounts,
    work: Callable[[Any], Awaitable[float]],
) -> tuple[int, float]:
    """Statements of one ``work`` (two runs minus one, each from a fresh state to its close)."""
    spent = []
    wall = 0.0
    for times in (1, 2):
        before = await _settled(counts)
        state = api.module.state_from_url(url, prefix="bench:")
        try:
            for _ in range(times):
                wall = await work(state)
        finally:
            await state.aclose()
        spent.append(await _settled(counts) - before)
    return spent[1] - spent[0], wall


async def _sql(api: Asynclock, backend: str, rounds: int) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if backend == "postgres":
        admin, label = PG_URL, "PostgreSQL"
        url = _with_database(PG_URL, DATABASE)
        counter: _PgCounts | _MariaCounts = _PgCounts(admin)
        unit = "transactions (one statement each)"
    else:
        admin, label = MYSQL_URL, "MariaDB"
        url = _with_database(MYSQL_URL, DATABASE, user=USER)
        counter = _MariaCounts(admin)
        unit = "statements"
    async with counter:
        await _prepare(api, url)
        have = 0
        for size in SIZES:
            await _populate(api, url, have, size)
            have = size
            refresh = [await _sql_cost(api, url, counter, _refresh) for _ in range(rounds)]
            floor = [await _sql_cost(api, url, counter, _floor) for _ in range(rounds)]
            ours = _median([float(n) for n, _ in refresh])
            base = _median([float(n) for n, _ in floor])
            wall = _median([t for _, t in refresh]) * 1000
            name = f"{label}, {size:,} keys with work"
            rows += [
                (f"{name}: {unit} per refresh", f"{ours:,.0f}"),
                (f"{name}: floor (inbox_keys + held_locks)", f"{base:,.0f}"),
                (
                    f"{name}: refresh / floor; wall time",
                    f"{ours / max(base, 1):.2f}x; {wall:,.0f} ms",
                ),
            ]
            log(f"dashboard: {name}: {ours:.0f} {unit}, {wall:.0f} ms")
    return rows


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("dashboard", f"skipped: {api}\n")
    rounds = cfg.rounds_or(3, 1)
    rows = await _redis(api, rounds)
    for backend in ("postgres", "mysql"):
        rows += await _sql(api, backend, rounds)
    body = (
        "## Dashboard: what one refresh costs the state\n\n"
        + kept("dashboard-intro")
        + "\n\n"
        + kv_table(rows)
        + "\n"
    )
    return Section("dashboard", body)


SCENARIO = Scenario("dashboard", run, redis=False, own_environment=True)
