"""What only the SQL states promise: odd keys, tokens across purges, options, unreachable servers."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import AsyncLock, Deduper, StateUnavailableError, state_from_url
from asynclock.state import Release
from asynclock.state._protocol import InboxState
from asynclock.state.sql import _state as sql_state_module
from tests._helpers import eventually, token_of
from tests._matrix import (
    MYSQL,
    POSTGRES,
    POSTGRES_PGBOUNCER,
    expire_rows,
    purge_namespace,
    require,
    rows_of,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import State
    from tests._matrix import Backend

SQL = [
    pytest.param(POSTGRES, id="postgres", marks=pytest.mark.postgres),
    pytest.param(POSTGRES_PGBOUNCER, id="postgres-pgbouncer", marks=pytest.mark.postgres),
    pytest.param(MYSQL, id="mysql", marks=pytest.mark.mysql),
]
SECRET = "s3cr3t-Pa55"


@pytest.fixture(params=SQL)
def sql_backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.param
    require(chosen)
    return chosen


@pytest.fixture
async def sql_state(sql_backend: Backend) -> AsyncIterator[State]:
    from tests._matrix import purge_namespace

    namespace = uuid.uuid4().hex
    state = state_from_url(sql_backend.url, **sql_backend.options(namespace))
    try:
        yield state
    finally:
        await state.aclose()
        await purge_namespace(sql_backend, namespace)


ODD_KEYS = [
    "quote ' double \" back \\ slash",
    "'; DROP TABLE asynclock_locks; --",
    "ünïcödé 锁 🔒",
    "percent %s %(name)s {prefix}",
    "x" * 1024,
    "y" * 10_000,
    "new\nline\ttab",
]


@pytest.mark.parametrize("key", ODD_KEYS, ids=range(len(ODD_KEYS)))
async def test_any_key_is_just_a_key(sql_state: State, key: str) -> None:
    async with AsyncLock(sql_state, key, ttl=10.0) as lock:
        info = await sql_state.inspect(key)
        assert info is not None
        assert (info.key, info.owner, info.token) == (key, lock.owner, lock.token)
        assert not await AsyncLock(sql_state, key + "!").locked()
    assert await sql_state.inspect(key) is None
    dedupe = Deduper(sql_state, ttl=10.0)
    assert await dedupe.first_seen(key)
    assert not await dedupe.first_seen(key)


async def test_tokens_keep_increasing_after_the_row_is_purged(sql_backend: Backend) -> None:
    namespace = uuid.uuid4().hex
    # no background purge: it could delete the rows before the explicit one counts them
    options = {**sql_backend.options(namespace), "token_retention": 0.001, "purge_interval": None}
    state = state_from_url(sql_backend.url, **options)
    try:
        lock = AsyncLock(state, "k", ttl=10.0)
        tokens = []
        for _ in range(3):
            async with lock:
                tokens.append(token_of(lock))
        await asyncio.sleep(0.01)
        purge = getattr(state, "purge_expired")  # noqa: B009 - SQL states only
        # the row goes, by these purges or by another state's on the same tables: a purge takes
        # expired rows in batches, and the other tests' rows (their states purge in the
        # background too) may fill the first one
        deadline = time.monotonic() + 10.0
        while await rows_of(sql_backend, "asynclock_locks", str(options["prefix"])) != 0:
            assert time.monotonic() < deadline, "the released lock's row was never purged"
            assert await purge() >= 0
        async with lock:
            tokens.append(token_of(lock))
        assert tokens == sorted(set(tokens)), tokens
    finally:
        await state.aclose()


async def test_expired_dedupe_records_are_purged(sql_state: State, sql_backend: Backend) -> None:
    dedupe = Deduper(sql_state, ttl=600.0)
    assert await dedupe.first_seen("evt")
    prefix = getattr(sql_state, "prefix")  # noqa: B009 - SQL states only
    assert await rows_of(sql_backend, "asynclock_dedupe", prefix) == 1
    # expired by hand rather than by a TTL of 50 ms, which could run out before the count
    # above: another test's purge would then have deleted the row first
    await expire_rows(sql_backend, "asynclock_dedupe", prefix)
    purge = getattr(sql_state, "purge_expired")  # noqa: B009 - SQL states only
    # the row is gone, by this purge or by another state's (purges take every expired row of
    # the table, and other tests' states purge in the background on the same server)
    assert await purge() >= 0
    assert await rows_of(sql_backend, "asynclock_dedupe", prefix) == 0
    assert await dedupe.first_seen("evt")


async def test_a_background_purge_deletes_every_expired_row(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One background purge per purge_interval used to delete one batch: with more expired
    # records than a batch per interval (steady traffic), the table grew without bound (#30,
    # the inbox-growth soak). A batch of 5 here stands for the 500 of a real purge.
    monkeypatch.setattr(sql_state_module, "PURGE_BATCH", 5)
    namespace = uuid.uuid4().hex
    options = sql_backend.options(namespace)
    prefix = str(options["prefix"])
    writer = state_from_url(sql_backend.url, purge_interval=None, **options)
    # one purge at its first operation, and none for an hour after it
    purger = state_from_url(sql_backend.url, purge_interval=3600.0, **options)
    try:
        for n in range(12):
            assert await writer.dedupe_add(f"d{n}", 600.0)
        await expire_rows(sql_backend, "asynclock_dedupe", prefix)
        assert await purger.dedupe_add("live", 600.0)  # starts the background purge

        async def only_the_live_record_left() -> bool:
            return await rows_of(sql_backend, "asynclock_dedupe", prefix) == 1

        await eventually(only_the_live_record_left, within=10.0)
    finally:
        await writer.aclose()
        await purger.aclose()
        await purge_namespace(sql_backend, namespace)


async def test_an_idle_inbox_workers_rescans_purge_too(sql_backend: Backend) -> None:
    # A serve() with nothing to do still rescans every few seconds: its state purges on those,
    # so expired rows do not wait for the next accept (#30, the inbox-growth soak).
    namespace = uuid.uuid4().hex
    options = sql_backend.options(namespace)
    prefix = str(options["prefix"])
    writer = state_from_url(sql_backend.url, purge_interval=None, **options)
    worker = state_from_url(sql_backend.url, purge_interval=0.001, **options)
    try:
        for n in range(3):
            assert await writer.dedupe_add(f"d{n}", 600.0)
        await expire_rows(sql_backend, "asynclock_dedupe", prefix)
        assert isinstance(worker, InboxState)

        async def purged() -> bool:
            await worker.inbox_ready()  # a rescan, and nothing else
            return await rows_of(sql_backend, "asynclock_dedupe", prefix) == 0

        await eventually(purged, within=10.0)
    finally:
        await writer.aclose()
        await worker.aclose()
        await purge_namespace(sql_backend, namespace)


@pytest.mark.parametrize(
    "url",
    [f"postgresql://u:{SECRET}@127.0.0.1:1/db", f"mysql://u:{SECRET}@127.0.0.1:1/db"],
    ids=["postgres", "mysql"],
)
async def test_unreachable_server_raises_state_unavailable_in_time(url: str) -> None:
    state = state_from_url(url, connect_timeout=0.5, op_timeout=0.5)
    assert SECRET not in repr(state)
    try:
        start = time.monotonic()
        with pytest.raises(StateUnavailableError) as caught:
            await AsyncLock(state, "k", ttl=5.0).acquire(timeout=30.0)
        assert time.monotonic() - start < 2.0
        assert caught.value.__cause__ is not None
        assert SECRET not in str(caught.value)
    finally:
        await state.aclose()


async def test_schema_and_table_prefix_options(sql_backend: Backend) -> None:
    with pytest.raises(ValueError, match="table_prefix"):
        state_from_url(sql_backend.url, table_prefix="bad-name;")
    state = state_from_url(sql_backend.url, create_schema=False, table_prefix="nope_missing_")
    try:
        with pytest.raises(Exception, match="nope_missing_locks"):
            await state.inspect("k")
    finally:
        await state.aclose()


@pytest.fixture
async def three_states(sql_backend: Backend) -> AsyncIterator[tuple[State, State, State]]:
    """Three states (three "processes") on one namespace; a release reserves for 5 s."""
    from tests._matrix import purge_namespace

    namespace = uuid.uuid4().hex
    options = {**sql_backend.options(namespace), "reservation": 5.0}
    states = tuple(state_from_url(sql_backend.url, **options) for _ in range(3))
    try:
        yield states[0], states[1], states[2]
    finally:
        for state in states:
            await state.aclose()
        await purge_namespace(sql_backend, namespace)


@pytest.fixture
async def flagged(three_states: tuple[State, State, State]) -> tuple[State, State, State]:
    """(holder, waiter, other): holder took "k" as "h"; waiter's waiting "w" flagged it."""
    holder, waiter, _ = three_states
    assert (await holder.acquire("k", "h", 10.0)).token is not None
    assert (await waiter.acquire("k", "w", 10.0, waiting=True)).token is None
    return three_states


async def test_abandon_withdraws_the_waiting_flag(
    flagged: tuple[State, State, State],
) -> None:
    holder, waiter, other = flagged
    await waiter.abandon("k", "w")  # its process stops waiting
    assert (await holder.release("k", "h")).owned
    # no reservation was left for the waiter: anyone takes the key at once
    assert (await other.acquire("k", "o", 10.0)).token is not None


async def test_abandon_frees_a_reservation_at_once_and_wakes_watchers(
    flagged: tuple[State, State, State],
) -> None:
    holder, waiter, other = flagged
    assert (await holder.release("k", "h")).owned  # reserved for the waiter's state
    blocked = await other.acquire("k", "o", 10.0)
    assert blocked.token is None  # reserved for the waiter's state: nobody else gets it
    assert blocked.retry_after is not None
    # both tell a caller to look at a reservation again within 20 ms (taking one notifies
    # nobody), not to sleep out the reservation
    assert 0.0 < blocked.retry_after <= 0.02
    async with other.watch("k") as watch:
        watch.reset()
        await waiter.abandon("k", "w")
        if type(other).__name__ == "PostgresState":  # MySQL's watchers poll instead
            assert await watch.wait(2.0), "the freed reservation was not announced"
    assert (await other.acquire("k", "o", 10.0)).token is not None
    # the abandoned owner's late acquire can no longer win
    assert await other.release("k", "o") == Release(owned=True)
    assert (await waiter.acquire("k", "w", 10.0, waiting=True)).token is None


async def test_abandon_by_the_holder_keeps_another_states_reservation(
    flagged: tuple[State, State, State],
) -> None:
    holder, waiter, other = flagged
    await holder.abandon("k", "h")  # releases; the waiter's flag is not the holder's to withdraw
    assert (await other.acquire("k", "o", 10.0)).token is None  # reserved for the waiter
    assert (await waiter.acquire("k", "w2", 10.0, waiting=True)).token is not None


@pytest.fixture
async def blocked_row(sql_backend: Backend) -> AsyncIterator[Blocker]:
    """Row "k" exists; ``blocker.state(...)`` makes states, ``blocker.hold()`` row-locks "k"."""
    from tests._matrix import purge_namespace

    namespace = uuid.uuid4().hex
    blocker = Blocker(sql_backend, sql_backend.options(namespace))
    try:
        yield blocker
    finally:
        for state in blocker.states:
            await state.aclose()
        await purge_namespace(sql_backend, namespace)


class Blocker:
    """States on one namespace, and a session of their own kind that can row-lock key "k"."""

    def __init__(self, backend: Backend, options: dict[str, object]) -> None:
        self.backend = backend
        self.options = options
        self.states: list[State] = []

    async def state(self, **options: object) -> State:
        """A state with these options whose key "k" has its lock row (taken and released)."""
        state = state_from_url(self.backend.url, **self.options, **options)
        self.states.append(state)
        async with AsyncLock(state, "k", ttl=10.0):
            pass
        return state

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold "k"'s row lock in an open transaction on a connection of a separate state."""
        from asynclock.state.sql._queries import key_id

        ident = key_id(f"{self.options['prefix']}k")
        session: Any = await self.state()
        conn, _ = await session._source.checkout()
        if self.backend is not MYSQL:
            await conn.execute("BEGIN")
            await conn.execute("SELECT 1 FROM asynclock_locks WHERE id = $1 FOR UPDATE", ident)
            yield
            await conn.execute("ROLLBACK")
        else:
            cursor = await conn.cursor()
            await cursor.execute("BEGIN")
            sql = "SELECT 1 FROM asynclock_locks WHERE id = UNHEX(%s) FOR UPDATE"
            await cursor.execute(sql, (ident.hex(),))
            yield
            await cursor.execute("ROLLBACK")
        session._source.checkin(conn, broken=False)


async def test_a_cancelled_statement_never_hands_its_connection_on(blocked_row: Blocker) -> None:
    # The acquire waits for a row lock that another session holds; it is cancelled there, with
    # its statement still running on the server. The connection must not go back to the pool
    # (its reply would reach the next statement): the next operations run on a fresh one.
    state = await blocked_row.state(max_connections=1)
    async with blocked_row.hold():
        task = asyncio.create_task(state.acquire("k", "cancelled", 10.0))
        await asyncio.sleep(0.2)  # on the server, waiting for the row lock
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await state.abandon("k", "cancelled")
    async with AsyncLock(state, "k", ttl=10.0) as lock:
        info = await state.inspect("k")
        assert info is not None
        assert info.owner == lock.owner
    assert await state.inspect("k") is None


async def test_a_statement_stuck_past_op_timeout_raises_and_the_state_recovers(
    blocked_row: Blocker,
) -> None:
    state = await blocked_row.state(op_timeout=0.5)
    async with blocked_row.hold():
        start = time.monotonic()
        with pytest.raises(StateUnavailableError, match="op_timeout") as caught:
            await state.acquire("k", "stuck", 10.0)
        assert 0.4 < time.monotonic() - start < 1.5
        assert isinstance(caught.value.__cause__, TimeoutError)
        # a cancellation from outside is still a cancellation, not a timeout
        task = asyncio.create_task(state.acquire("k", "cancelled", 10.0))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await state.abandon("k", "stuck")
    await state.abandon("k", "cancelled")
    async with AsyncLock(state, "k", ttl=10.0) as lock:
        assert await state.extend("k", lock.owner, 10.0)


@pytest.mark.postgres
async def test_the_pgbouncer_row_moves_a_client_between_server_connections() -> None:
    """The ``postgres-pgbouncer`` row tests transaction pooling, not a pass-through: one client
    connection's transactions run on more than one server connection (PgBouncer 1.18 does not
    carry a named prepared statement along, hence ``statement_cache_size=0`` in its URL)."""
    import asyncpg  # type: ignore[import-untyped]

    from asynclock.state.postgres._pooler import pooler_options

    require(POSTGRES_PGBOUNCER)
    pooled = pooler_options(POSTGRES_PGBOUNCER.url, None, None)
    # more clients than the pool's 4 server connections (.ci/services.sh), all busy at once
    clients = [await asyncpg.connect(pooled.dsn, statement_cache_size=0) for _ in range(8)]
    try:
        seen: list[set[int]] = [set() for _ in clients]
        for _ in range(10):
            pids = await asyncio.gather(
                *(c.fetchval("SELECT pg_backend_pid() FROM pg_sleep(0.005)") for c in clients)
            )
            for client_pids, pid in zip(seen, pids, strict=True):
                client_pids.add(pid)
        assert max(len(pids) for pids in seen) > 1, seen
        assert len(set().union(*seen)) < len(clients), seen  # fewer servers than clients
    finally:
        for client in clients:
            await client.close()
