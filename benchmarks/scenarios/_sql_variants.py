"""The timed rows of the ``sql`` scenario: raw-statement floors and asynclock states.

Each is a harness ``Variant``; ``interleave`` runs a list of them round-robin (the harness's
rounds) and divides each by its same-round references.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

from benchmarks.harness.rounds import interleave as _interleave
from benchmarks.harness.scenario import Variant
from benchmarks.harness.sql_server import (
    CHANNEL,
    DEDUPE_NAMESPACE,
    DEDUPE_TTL,
    LABEL,
    MYSQL_URL,
    PG_URL,
    RESERVATION_MS,
    TTL_MS,
    commit_label,
    dollar,
    key_id,
    load_statements,
    mysql_connect,
    owner_base,
    pg_connect,
)
from benchmarks.harness.states import STATE_CLASSES, open_state, warm_state

if TYPE_CHECKING:
    from benchmarks.harness.env import (
        Asynclock,
    )
    from benchmarks.harness.report import Rounds

DUPLICATE_IDS = 100
WARMUP = 30


def acquire_args(ident: Any, full: str, owner: str) -> dict[str, Any]:
    """The ``acquire`` statement's parameters of both backends: a fresh ``owner`` takes ``full``."""
    mark = f"\n{owner}\n"
    return {
        "id": ident,
        "name": full,
        "owner": owner,
        "mark": mark,
        "ttl_ms": TTL_MS,
        "waiter": None,
    }


def release_args(ident: Any, owner: str) -> dict[str, Any]:
    """The ``release`` statement's parameters of both backends: no successor."""
    release = {"id": ident, "owner": owner, "successor": None, "successor_mark": None}
    return {**release, "successor_ttl_ms": 0, "reservation_ms": RESERVATION_MS}


class OnPostgres(Variant):
    """A row on one asyncpg connection (``sync``: its synchronous_commit, None: the server's)."""

    backend = "postgres"
    sync: str | None = "off"
    conn: Any = None

    async def setup(self) -> None:
        self.conn = await pg_connect(PG_URL, self.sync)

    async def teardown(self) -> None:
        await self.conn.close()


class OnMariaDB(Variant):
    """A row on one aiomysql connection."""

    backend = "mysql"
    conn: Any = None

    async def setup(self) -> None:
        self.conn = await mysql_connect(MYSQL_URL)

    async def teardown(self) -> None:
        self.conn.close()


class PgSelect(OnPostgres):
    name = "PostgreSQL floor: 2 x `SELECT 1` (asyncpg)"

    async def loop(self, n: int) -> None:
        fetchval = self.conn.fetchval
        for _ in range(n):
            await fetchval("SELECT 1")
            await fetchval("SELECT 1")


#: the statements' claim parameters set to "no claim" (PostgresState is a ClaimingState: its
#: acquire and release can also record an event's dedupe claim; the floor records none)
NO_CLAIM: dict[str, object] = {"claim_id": None, "claim_name": None, "claim_ttl_ms": 0}


class PgRaw(OnPostgres):
    """PostgresState's ``acquire`` + ``release`` statements on one asyncpg connection."""

    def __init__(self, prefix: str, key: str, synchronous_commit: str | None) -> None:
        super().__init__()
        self.name = "PostgreSQL raw floor: state's acquire + release statements, " + commit_label(
            synchronous_commit
        )
        self.sync = synchronous_commit
        self.full = prefix + key
        stmts = load_statements("postgres")
        self.acquire_sql, self.acquire_names = dollar(stmts["acquire"])
        self.release_sql, self.release_names = dollar(stmts["release"])

    async def loop(self, n: int) -> None:
        fetch, ident, full = self.conn.fetch, key_id(self.full), self.full
        base, misses = owner_base(), 0
        for _ in range(n):
            owner = f"{base}:{secrets.token_hex(8)}"
            acquire = {**NO_CLAIM, **acquire_args(ident, full, owner)}
            rows = await fetch(self.acquire_sql, *[acquire[k] for k in self.acquire_names])
            if not isinstance(rows[0][0], int):
                misses += 1
            release = {**NO_CLAIM, **release_args(ident, owner), "channel": CHANNEL}
            release["payload"] = ident.hex()
            if not await fetch(self.release_sql, *[release[k] for k in self.release_names]):
                misses += 1
        self.passed(misses)


class MySelect(OnMariaDB):
    name = "MariaDB floor: 2 x `SELECT 1` (aiomysql)"

    async def loop(self, n: int) -> None:
        cursor = await self.conn.cursor()
        for _ in range(n):
            await cursor.execute("SELECT 1")
            await cursor.fetchall()
            await cursor.execute("SELECT 1")
            await cursor.fetchall()
        await cursor.close()


class MyRaw(OnMariaDB):
    """MySQLState's ``acquire`` + ``release`` statements on one aiomysql connection."""

    def __init__(self, prefix: str, key: str) -> None:
        super().__init__()
        self.name = "MariaDB raw floor: state's acquire + release statements"
        self.full = prefix + key
        stmts = load_statements("mysql")
        self.acquire_sql, self.release_sql = stmts["acquire"], stmts["release"]

    async def loop(self, n: int) -> None:
        cursor = await self.conn.cursor()
        ident, full = key_id(self.full).hex(), self.full
        base, misses = owner_base(), 0
        for _ in range(n):
            owner = f"{base}:{secrets.token_hex(8)}"
            await cursor.execute(self.acquire_sql, acquire_args(ident, full, owner))
            if (cursor.lastrowid or 0) < 10**15:
                misses += 1
            await cursor.execute(self.release_sql, release_args(ident, owner))
            if cursor.rowcount != 1:
                misses += 1
        await cursor.close()
        self.passed(misses)


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
        self.state = open_state(self.api, self.backend, self.url, self.prefix, **self.options)

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
        cls = STATE_CLASSES[backend]
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
        await warm_state(self.state, self.key)
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


async def interleave(
    variants: list[Variant], rounds: Rounds, n: int, rounds_n: int, part: str
) -> None:
    """The harness's interleaved rounds, warmed with :data:`WARMUP` operations."""
    scenario = f"sql {part}"
    await _interleave(
        variants, rounds, n=n, rounds_n=rounds_n, scenario=scenario, warmup=WARMUP, label=short
    )


def short(label: str) -> str:
    """A row's label for progress lines: no markdown."""
    return label.replace("**", "").replace("`", "").replace("asynclock async with AsyncLock", "lib")
