"""Passwords never leak; SQL keys are data, never statements (issue #7)."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import pytest

from asynclock import AsyncLock, Deduper, StateUnavailableError, state_from_url
from tests._matrix import MYSQL, POSTGRES, SQL_TABLES, TEST_PREFIX, purge_namespace, require
from tests.security.test_redis_auth_tls import everything_said

if TYPE_CHECKING:
    from tests._matrix import Backend

pytestmark = pytest.mark.security

SECRET = "pa55-W0rd-d0nt-l3ak"
#: URLs with a password at a port nothing listens on (so the connection fails)
FAILING = {
    "redis": f"redis://alice:{SECRET}@127.0.0.1:1/0",
    "redis-query": f"redis://127.0.0.1:1/0?password={SECRET}",
    "rediss": f"rediss://alice:{SECRET}@127.0.0.1:1/0",
    "postgres": f"postgresql://app:{SECRET}@127.0.0.1:1/db",
    "postgres-query": f"postgresql://app@127.0.0.1:1/db?password={SECRET}",
    "mysql": f"mysql://app:{SECRET}@127.0.0.1:1/db",
}


@pytest.mark.parametrize("url", FAILING.values(), ids=FAILING.keys())
async def test_a_failing_connection_never_shows_the_password(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    state = state_from_url(url, connect_timeout=0.5, op_timeout=0.5)
    try:
        assert SECRET not in repr(state)
        assert SECRET not in str(state)
        with pytest.raises(StateUnavailableError) as lock_error:
            await AsyncLock(state, "k", ttl=5.0).acquire()
        with pytest.raises(StateUnavailableError) as dedupe_error:
            await Deduper(state).first_seen("evt")
    finally:
        await state.aclose()
    for error in (lock_error.value, dedupe_error.value):
        said = everything_said(error, caplog)
        assert SECRET not in said, said[:2000]
        assert "127.0.0.1" in str(error)


@pytest.mark.parametrize(
    "url",
    [f"mysql://app:{SECRET}@127.0.0.1:bad/db", f"postgresql://app:{SECRET}@127.0.0.1:99999/db"],
)
def test_a_malformed_url_never_shows_the_password(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        state_from_url(url)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value)


HOSTILE_SQL_KEYS = (
    "'; DROP TABLE asynclock_locks; --",
    '"; DROP TABLE asynclock_dedupe; --',
    "x'); DELETE FROM asynclock_locks; --",
    "1' OR '1'='1",
    "; DROP TABLE x; --",
    "%s %(owner)s $1 ? :name",
    "\\'; SELECT pg_sleep(5); --",
    "` OR 1=1; --",
    "%_ LIKE wildcards _%",
)


@pytest.fixture(params=[POSTGRES, MYSQL], ids=["postgres", "mysql"])
def sql_backend(request: pytest.FixtureRequest) -> Backend:
    backend: Backend = request.param
    require(backend)
    return backend


async def table_names(backend: Backend) -> set[str]:
    """The asynclock tables that exist on the server, asked with the driver directly."""
    if backend is POSTGRES:
        import asyncpg  # type: ignore[import-untyped]

        conn = await asyncpg.connect(backend.url, timeout=10)
        try:
            rows = await conn.fetch(
                "SELECT tablename FROM pg_tables WHERE tablename = ANY($1::text[])",
                list(SQL_TABLES),
            )
        finally:
            await conn.close()
        return {row["tablename"] for row in rows}
    import aiomysql  # type: ignore[import-untyped]

    parts = urlsplit(backend.url)
    conn = await aiomysql.connect(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 3306,
        user=unquote(parts.username or "root"),
        password=unquote(parts.password or ""),
        db=parts.path.lstrip("/"),
        connect_timeout=10,
    )
    try:
        async with conn.cursor() as cursor:
            await cursor.execute("SHOW TABLES")
            names = {row[0] for row in await cursor.fetchall()}
    finally:
        conn.close()
    return names & set(SQL_TABLES)


async def test_sql_injection_text_is_just_a_key(sql_backend: Backend) -> None:
    namespace = uuid.uuid4().hex
    state = state_from_url(sql_backend.url, prefix=f"{TEST_PREFIX}{namespace}:")
    try:
        # an innocent key first, so the tables exist before the hostile ones arrive
        async with AsyncLock(state, "innocent", ttl=10.0):
            pass
        assert await table_names(sql_backend) == set(SQL_TABLES)
        dedupe = Deduper(state, ttl=30.0)
        for key in HOSTILE_SQL_KEYS:
            async with AsyncLock(state, key, ttl=10.0) as lock:
                info = await state.inspect(key)
                assert info is not None
                assert info.owner == lock.owner
                assert not await AsyncLock(state, key).acquire(blocking=False)
                # a similar key is another key (no LIKE, no truncation, no escaping mix-up)
                assert not await AsyncLock(state, key + " ").locked()
            assert not await AsyncLock(state, key).locked()
            assert await dedupe.first_seen(key)
            assert not await dedupe.first_seen(key)
            assert await dedupe.first_seen(key.upper() + "!")
        assert await table_names(sql_backend) == set(SQL_TABLES), "a table disappeared"
        # the rows of the innocent key survived every statement
        async with AsyncLock(state, "innocent", ttl=10.0) as again:
            assert again.token is not None
    finally:
        await state.aclose()
        await purge_namespace(sql_backend, namespace)
