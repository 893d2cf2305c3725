"""The SQL servers of the ``sql`` scenario: their URLs, statements, connections, facts, clean-up.

The statements are read from ``queries.sql`` exactly as PostgresState / MySQLState load them, so
the raw floors issue the very statements the states do; the connections are opened as the
drivers' users open them.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import re
import socket
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

from benchmarks.harness.env import (
    Asynclock,
    redact,
)

PG_URL = os.environ.get("ASYNCLOCK_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MYSQL_URL = os.environ.get("ASYNCLOCK_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")

#: what the states pass, read from asynclock/state/{postgres,mysql}/__init__.py
TABLE_PREFIX = "asynclock_"  # the default table_prefix
TTL_MS = 30_000  # AsyncLock(..., ttl=30.0) -> ttl_ms(30.0)
RESERVATION_MS = 250  # the default reservation=0.25 s
CHANNEL = f"{TABLE_PREFIX}released"  # PostgresState's NOTIFY channel
DEDUPE_TTL = 600.0  # Deduper's default ttl
DEDUPE_NAMESPACE = "dedupe"  # Deduper's default namespace

BACKENDS = ("postgres", "mysql", "redis")
LABEL = {"postgres": "PostgreSQL", "mysql": "MariaDB", "redis": "Redis"}

# -- the statements, as the states load them ---------------------------------------------------

_BLOCK = re.compile(r"^-- ([a-z_][a-z0-9_]*) --[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


def load_statements(backend: str) -> dict[str, str]:
    """The named statements of ``asynclock/state/<backend>/queries.sql``, table prefix applied.

    The same reading as ``asynclock.state.sql._queries.load_queries`` (a ``-- name --`` line, comment
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
        ("PostgreSQL server", f"{version} at `{redact(url)}`"),
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
        ("MariaDB/MySQL server", f"{version} at `{redact(url)}`"),
        ("MariaDB/MySQL global variables", settings),
        (
            "MariaDB/MySQL session settings",
            (
                "MySQLState.from_url: autocommit, `READ COMMITTED`, `CLIENT_FOUND_ROWS`, "
                "utf8mb4, `innodb_lock_wait_timeout=5`, `sql_notes=0`; the raw floor uses the same"
            ),
        ),
    ]


async def cleanup(prefix: str) -> str:
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
