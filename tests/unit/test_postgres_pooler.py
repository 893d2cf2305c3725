"""The options for PostgreSQL behind a transaction-mode pooler: parsed, checked, kept from asyncpg.

Whether they work is shown by the ``postgres-pgbouncer`` row of the conformance matrix; these
tests pin what ``from_url`` accepts and refuses, without a server.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from asynclock.state.postgres import PostgresState
from asynclock.state.postgres._pooler import pooler_options

DIRECT = "postgresql://app:s3cr3t@127.0.0.1:5432/db"
BOUNCER = "postgresql://app@127.0.0.1:6432/db"


def test_the_query_options_are_taken_off_the_url_and_the_others_stay() -> None:
    url = f"{BOUNCER}?sslmode=disable&statement_cache_size=0&listen_url={quote(DIRECT, safe='')}"
    options = pooler_options(url, None, None)
    assert options.dsn == f"{BOUNCER}?sslmode=disable"
    assert options.listen_dsn == DIRECT
    assert options.statement_cache_size == 0


def test_without_options_the_url_is_untouched_and_the_listener_uses_it() -> None:
    url = f"{BOUNCER}?application_name=bot"
    options = pooler_options(url, None, None)
    assert (options.dsn, options.listen_dsn, options.statement_cache_size) == (url, url, None)


def test_a_keyword_wins_over_the_query_parameter() -> None:
    url = f"{BOUNCER}?statement_cache_size=0&listen_url={quote(BOUNCER, safe='')}"
    options = pooler_options(url, DIRECT, 20)
    assert (options.dsn, options.listen_dsn, options.statement_cache_size) == (BOUNCER, DIRECT, 20)


@pytest.mark.parametrize("text", ["-1", "zero", "", "1.5"])
def test_a_bad_cache_size_in_the_url_is_named(text: str) -> None:
    with pytest.raises(ValueError, match=f"statement_cache_size.*got '{text}'"):
        pooler_options(f"{BOUNCER}?statement_cache_size={text}", None, None)


def test_a_bad_cache_size_keyword_is_refused() -> None:
    with pytest.raises(ValueError, match="statement_cache_size must be >= 0, got -1"):
        pooler_options(BOUNCER, None, -1)
    with pytest.raises(TypeError, match="statement_cache_size must be an int, got bool"):
        pooler_options(BOUNCER, None, True)  # a bool is an int to mypy, not here
    with pytest.raises(TypeError, match="listen_url must be a str, got int"):
        pooler_options(BOUNCER, 5432, None)  # type: ignore[arg-type]  # the mistake tested


def test_a_listen_url_of_another_scheme_is_refused_without_its_password() -> None:
    with pytest.raises(ValueError, match="listen_url must be a postgresql:// URL") as caught:
        pooler_options(BOUNCER, "redis://app:s3cr3t@127.0.0.1:6379", None)
    assert "s3cr3t" not in str(caught.value)


def test_from_url_checks_the_listen_port_and_never_shows_its_password() -> None:
    bad = quote("postgresql://app:s3cr3t@127.0.0.1:99999/db", safe="")
    with pytest.raises(ValueError, match="port must be 1-65535") as caught:
        PostgresState.from_url(f"{BOUNCER}?listen_url={bad}")
    assert "s3cr3t" not in str(caught.value)
    state = PostgresState.from_url(f"{BOUNCER}?listen_url={quote(DIRECT, safe='')}")
    assert "s3cr3t" not in repr(state)
    assert "listen_url" not in repr(state)
