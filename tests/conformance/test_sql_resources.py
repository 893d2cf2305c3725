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
    assert set(queries) == QUERIES
    for query in queries.values():
        assert query.description, f"{query.name} has no description"
        assert "{prefix}" not in query.text
        assert "asynclock_locks" in query.text or "asynclock_dedupe" in query.text


@pytest.mark.parametrize("package", PACKAGES)
def test_schema_is_idempotent_create_statements(package: str) -> None:
    statements = load_schema(package, "app_")
    assert len(statements) == 2
    for statement in statements:
        assert "CREATE TABLE IF NOT EXISTS app_" in statement


def test_positional_placeholders_reuse_numbers() -> None:
    query = load_queries("asynclock.state.postgres", "asynclock_")["extend"]
    sql, names = query.dollar()
    assert names == ("ttl_ms", "id", "owner")
    assert "%(" not in sql
    assert "$3" in sql
