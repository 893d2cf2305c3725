"""The SQL files ship in the package, parse, and define every query the SQL states run."""

from __future__ import annotations

from importlib import resources

import pytest

from asynclock.state._sql import load_queries, load_schema

PACKAGES = ("asynclock.state.postgres", "asynclock.state.mysql")
QUERIES = {
    "acquire",
    "release",
    "abandon",
    "extend",
    "inspect",
    "dedupe_add",
    "dedupe_forget",
    "dedupe_keep",
    "purge_locks",
    "purge_dedupe",
    "held_locks",
}


@pytest.mark.parametrize("package", PACKAGES)
def test_sql_files_load_from_the_package(package: str) -> None:
    folder = resources.files(package)
    for name in ("schema.sql", "queries.sql"):
        text = folder.joinpath(name).read_text(encoding="utf-8")
        assert text.startswith("--"), f"{package}/{name} must open with its contract comment"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_query_is_defined_and_described(package: str) -> None:
    queries = load_queries(package, "asynclock_")
    # PostgreSQL is also a ClaimingState: its acquire and release take an optional claim, and
    # it forgets a claim by owner
    extra = {"forget_claimed"} if package.endswith("postgres") else set()
    assert set(queries) == QUERIES | extra
    for query in queries.values():
        assert query.description, f"{query.name} has no description"
        assert "{prefix}" not in query.text
        assert "asynclock_locks" in query.text or "asynclock_dedupe" in query.text


@pytest.mark.parametrize("package", PACKAGES)
def test_schema_is_idempotent_create_statements(package: str) -> None:
    statements = load_schema(package, "app_")
    creates = [s for s in statements if "CREATE TABLE IF NOT EXISTS app_" in s]
    assert len(creates) == 2
    # anything else brings an older table up to date, and only when it needs it
    for statement in statements:
        assert statement in creates or "IF NOT EXISTS" in statement


def test_positional_placeholders_reuse_numbers() -> None:
    query = load_queries("asynclock.state.postgres", "asynclock_")["extend"]
    sql, names = query.dollar()
    assert names == ("ttl_ms", "id", "owner")
    assert "%(" not in sql
    assert "$3" in sql
