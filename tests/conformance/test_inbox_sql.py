"""The SQL inbox's concurrency corners: what one transaction per key must hold under contention.

Several states (each with its own connections, as several processes would have) race on one
key of PostgreSQL or MySQL; ``test_inbox.py`` covers the semantics every backend shares.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import TYPE_CHECKING

import asyncpg  # type: ignore[import-untyped]
import pytest

from asynclock import LockNotOwnedError, state_from_url
from asynclock.state.sql._inbox import SQLInboxState
from asynclock.state.sql._queries import load_schema
from tests._matrix import (
    POSTGRES,
    POSTGRES_PGBOUNCER,
    SQL_INBOX_STATES,
    Backend,
    expire_rows,
    purge_namespace,
    require,
    rows_of,
    run_sql,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

#: PostgreSQL, direct and behind PgBouncer (its NOTIFY's cost, #24)
PG_BACKENDS = (POSTGRES, POSTGRES_PGBOUNCER)
#: states racing (each opens its own connections)
CLIENTS = 4
#: the name of a routine schema.sql creates (without its table prefix)
_ROUTINE = re.compile(
    r"^CREATE (?:OR REPLACE FUNCTION|PROCEDURE IF NOT EXISTS) (\w+)\(", re.MULTILINE
)


class Clients:
    """``CLIENTS`` states of one fresh namespace."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.namespace = uuid.uuid4().hex
        self.states: list[SQLInboxState[object, object, object]] = []

    def open(self, **options: object) -> SQLInboxState[object, object, object]:
        state = state_from_url(self.backend.url, **self.backend.options(self.namespace), **options)
        assert isinstance(state, SQLInboxState)
        self.states.append(state)
        return state


@pytest.fixture(params=SQL_INBOX_STATES)
async def clients(request: pytest.FixtureRequest) -> AsyncIterator[Clients]:
    backend: Backend = request.param
    require(backend)
    made = Clients(backend)
    for _ in range(CLIENTS):
        made.open()
    yield made
    for state in made.states:
        await state.aclose()
    await purge_namespace(backend, made.namespace)


async def test_concurrent_accepts_of_one_event_id_accept_it_once(clients: Clients) -> None:
    states = clients.states
    for round_ in range(5):
        results = await asyncio.gather(
            *(
                states[n % CLIENTS].inbox_accept(
                    "k", f"payload {n}", claim=f"claim-{round_}", claim_ttl=60.0, max_pending=100
                )
                for n in range(24)
            )
        )
        statuses = sorted(r.status for r in results)
        assert statuses == ["accepted"] + ["duplicate"] * 23, statuses
    [info] = await states[0].inbox_keys()
    assert (info.key, info.pending) == ("k", 5)


async def test_concurrent_accepts_never_exceed_max_pending(clients: Clients) -> None:
    states = clients.states
    results = await asyncio.gather(
        *(
            states[n % CLIENTS].inbox_accept(
                "k", f"payload {n}", claim=f"claim-{n}", claim_ttl=60.0, max_pending=7
            )
            for n in range(40)
        )
    )
    assert sorted(r.status for r in results) == ["accepted"] * 7 + ["full"] * 33
    assert max(r.pending for r in results) == 7
    [info] = await states[0].inbox_keys()
    assert info.pending == 7
    # ids follow the order the server accepted them in, with no gap
    assert (await states[0].acquire("k", "drainer", 5.0)).token is not None
    ids = []
    done = None
    while (entry := await states[0].inbox_step("k", "drainer", done=done)) is not None:
        ids.append(entry.id)
        done = entry.id
    assert ids == list(range(1, 8))
    assert await states[0].inspect("k") is None


async def test_a_stale_owner_step_is_refused_and_changes_nothing(clients: Clients) -> None:
    first, second = clients.states[:2]
    await first.inbox_accept("k", "p", claim=None, claim_ttl=60.0, max_pending=10)
    assert (await first.acquire("k", "stale", 0.2)).token is not None
    entry = await first.inbox_step("k", "stale")
    assert entry is not None
    assert entry.attempt == 1
    await asyncio.sleep(0.3)  # the lock's TTL runs out on the server's clock
    assert (await second.acquire("k", "taker", 5.0)).token is not None
    for done, dead in ((entry.id, None), (entry.id, "boom"), (None, None)):
        with pytest.raises(LockNotOwnedError):
            await first.inbox_step("k", "stale", done=done, dead=dead)
    again = await second.inbox_step("k", "taker")
    assert again is not None
    assert (again.id, again.attempt, again.pending) == (entry.id, 2, 1)
    assert await second.inbox_dead_letters("k") == []
    assert await second.inbox_step("k", "taker", done=again.id) is None
    assert await second.inspect("k") is None


async def test_an_accept_racing_the_last_step_is_never_stranded(clients: Clients) -> None:
    # Either the step sees the new entry (and hands it out), or it released the lock first and
    # the accept finds the key free and listed as ready: never "released, entry unseen, held".
    drainer, producer = clients.states[:2]
    await producer.inbox_accept("k", "first", claim=None, claim_ttl=60.0, max_pending=100)
    for n in range(30):
        owner = f"drainer-{n}"
        assert (await drainer.acquire("k", owner, 5.0)).token is not None
        head = await drainer.inbox_step("k", owner)
        assert head is not None
        step, accepted = await asyncio.gather(
            drainer.inbox_step("k", owner, done=head.id),
            producer.inbox_accept("k", f"m{n}", claim=None, claim_ttl=60.0, max_pending=100),
        )
        assert accepted.status == "accepted"
        if step is None:
            assert await producer.inspect("k") is None
            assert await producer.inbox_ready() == ["k"]
        else:
            assert step.payload == f"m{n}"
            assert (await drainer.release("k", owner)).owned
    [info] = await producer.inbox_keys()
    assert info.pending == 1


async def test_the_purge_keeps_inbox_rows(clients: Clients) -> None:
    state = clients.open(token_retention=0.001, purge_interval=None)
    # long TTLs, then expired by hand: with TTLs of a millisecond, another test's purge could
    # delete the rows before they are counted here (purges take every expired row of a table)
    await state.inbox_accept("k", "p", claim="c", claim_ttl=600.0, max_pending=10)
    assert (await state.acquire("other", "owner", 600.0)).token is not None
    assert await rows_of(clients.backend, "asynclock_dedupe", state.prefix) == 1
    assert await rows_of(clients.backend, "asynclock_locks", state.prefix) == 1
    for table in ("asynclock_dedupe", "asynclock_locks"):
        await expire_rows(clients.backend, table, state.prefix)
    # the expired claim and the expired lock row are gone (by this purge or another state's),
    # the inbox rows are kept
    assert await state.purge_expired() >= 0
    assert await rows_of(clients.backend, "asynclock_dedupe", state.prefix) == 0
    assert await rows_of(clients.backend, "asynclock_locks", state.prefix) == 0
    [info] = await state.inbox_keys()
    assert (info.key, info.pending) == ("k", 1)
    assert await state.inbox_ready() == ["k"]


async def test_the_schema_is_created_once_by_states_starting_together(clients: Clients) -> None:
    table_prefix = f"t{uuid.uuid4().hex[:12]}_"
    racing = [clients.open(table_prefix=table_prefix) for _ in range(CLIENTS)]
    try:
        results = await asyncio.gather(
            *(
                s.inbox_accept("k", f"p{n}", claim=None, claim_ttl=60.0, max_pending=10)
                for n, s in enumerate(racing)
            )
        )
        assert sorted(r.pending for r in results) == [1, 2, 3, 4]
        again = clients.open(table_prefix=table_prefix)  # an existing schema is fine too
        assert await again.inbox_ready() == ["k"]
    finally:
        await _drop_tables(clients.backend, table_prefix)


#: the inboxes table as the releases before retries that wait and parking made it (#30)
_OLD_INBOXES = {
    "postgres": """CREATE TABLE {prefix}inboxes (
        id bytea PRIMARY KEY, name text NOT NULL, space bytea NOT NULL, last_id bigint NOT NULL,
        pending integer NOT NULL, dead integer NOT NULL, ready_at timestamptz
    ) WITH (fillfactor = 70)""",
    "mysql": """CREATE TABLE {prefix}inboxes (
        id BINARY(32) NOT NULL PRIMARY KEY, name LONGTEXT CHARACTER SET utf8mb4 NOT NULL,
        space BINARY(32) NOT NULL, last_id BIGINT NOT NULL, pending INT NOT NULL,
        dead INT NOT NULL, ready_at DATETIME(3) NULL, KEY by_space (space, ready_at)
    ) ENGINE = InnoDB""",
}


async def test_an_inboxes_table_of_an_earlier_release_is_upgraded(clients: Clients) -> None:
    table_prefix = f"t{uuid.uuid4().hex[:12]}_"
    dialect = "postgres" if clients.backend.name.startswith("postgres") else "mysql"
    try:
        await run_sql(clients.backend, [_OLD_INBOXES[dialect].format(prefix=table_prefix)])
        # states starting together: the columns are added once, whoever comes first
        racing = [clients.open(table_prefix=table_prefix) for _ in range(CLIENTS)]
        await asyncio.gather(
            *(
                s.inbox_accept("k", f"p{n}", claim=None, claim_ttl=60.0, max_pending=10)
                for n, s in enumerate(racing)
            )
        )
        state = racing[0]
        assert (await state.acquire("k", "owner", 5.0)).token is not None
        entry = await state.inbox_step("k", "owner")
        assert entry is not None
        assert await state.inbox_step("k", "owner", done=entry.id, retry_in=30.0) is None
        [info] = await state.inbox_keys()
        assert (info.pending, info.parked) == (CLIENTS, False)
        assert info.retry_in is not None
        assert 25.0 < info.retry_in <= 30.0
        assert await state.inbox_ready() == []
        assert await state.inspect("k") is None
    finally:
        await _drop_tables(clients.backend, table_prefix)


async def _drop_tables(backend: Backend, table_prefix: str) -> None:
    """Drop what ``schema.sql`` made under ``table_prefix`` (a name made by this test)."""
    postgres = backend.name.startswith("postgres")
    kind = "FUNCTION" if postgres else "PROCEDURE"
    package = "asynclock.state.postgres" if postgres else "asynclock.state.mysql"
    routines = _ROUTINE.findall("\n".join(load_schema(package, "")))
    tables = ("locks", "dedupe", "inboxes", "inbox_entries", "inbox_workers")
    statements = [f"DROP {kind} IF EXISTS {table_prefix}{name}" for name in routines]
    statements += [f"DROP TABLE IF EXISTS {table_prefix}{name}" for name in tables]
    await run_sql(backend, statements)


async def test_keys_payloads_and_errors_keep_every_character(clients: Clients) -> None:
    state = clients.states[0]
    key = "clé:👋:日本"
    payload = '{"text":"naïve 👋"}'
    accepted = await state.inbox_accept(key, payload, claim="c-é", claim_ttl=60.0, max_pending=5)
    assert accepted.status == "accepted"
    assert await state.inbox_ready() == [key]
    assert (await state.acquire(key, "owner", 5.0)).token is not None
    entry = await state.inbox_step(key, "owner")
    assert entry is not None
    assert entry.payload == payload
    assert await state.inbox_step(key, "owner", done=entry.id, dead="ValueError: ça 👎") is None
    [letter] = await state.inbox_dead_letters(key)
    assert (letter.error, letter.payload) == ("ValueError: ça 👎", payload)
    assert [info.key for info in await state.inbox_keys()] == [key]


@pytest.fixture(
    params=[pytest.param(b, id=b.name, marks=pytest.mark.postgres) for b in PG_BACKENDS]
)
async def pg_clients(request: pytest.FixtureRequest) -> AsyncIterator[Clients]:
    """``clients`` on PostgreSQL (direct and behind PgBouncer)."""
    backend: Backend = request.param
    require(backend)
    made = Clients(backend)
    for _ in range(CLIENTS):
        made.open()
    yield made
    for state in made.states:
        await state.aclose()
    await purge_namespace(backend, made.namespace)


async def test_a_drained_key_s_release_notifies_nobody_unless_a_waiter_flagged_it(
    pg_clients: Clients,
) -> None:
    # PostgreSQL signals every LISTENing session of the database at each commit that NOTIFYs,
    # whatever the channel, and each of them reads the queue in a transaction of its own: a
    # release that NOTIFYed at the end of every drained key cost one transaction per serving
    # worker per event (#24). Like the release statement, the step and the take that release a
    # key NOTIFY only when a waiter of some state flagged it; their own state wakes its watchers
    # in process.
    drainer, producer, waiter = pg_clients.states[:3]
    channel = f"{drainer._table_prefix}released"
    heard: list[str] = []
    mine: set[str] = set()
    sentinel = f"{channel}_{uuid.uuid4().hex[:8]}"
    synced = asyncio.Event()

    def on_released(conn: object, pid: object, name: object, payload: object) -> None:
        if str(payload) in mine:  # other tests share the channel
            heard.append(str(payload))

    listener = await asyncpg.connect(POSTGRES.url)
    try:
        await listener.add_listener(channel, on_released)
        await listener.add_listener(sentinel, lambda *_: synced.set())

        async def heard_by_now() -> list[str]:
            # notifications arrive in commit order: once the sentinel sent after every step is
            # heard, so is any NOTIFY those steps sent
            synced.clear()
            await listener.execute("SELECT pg_notify($1, '')", sentinel)
            await asyncio.wait_for(synced.wait(), 10)
            return list(heard)

        for n in range(3):  # one entry at a time, as the drainer's inbox_step
            key = f"step-{n}"
            mine.add(drainer._ids(key)[0].hex())
            await producer.inbox_accept(key, "x", claim=None, claim_ttl=60.0, max_pending=5)
            assert (await drainer.acquire(key, "o", 5.0)).token is not None
            entry = await drainer.inbox_step(key, "o")
            assert entry is not None
            assert await drainer.inbox_step(key, "o", done=entry.id) is None
        for n in range(3):  # by batches, as a folding drainer's inbox_take
            key = f"take-{n}"
            mine.add(drainer._ids(key)[0].hex())
            await producer.inbox_accept(key, "x", claim=None, claim_ttl=60.0, max_pending=5)
            assert (await drainer.acquire(key, "o", 5.0)).token is not None
            batch = await drainer.inbox_take(key, "o", limit=5)
            assert batch is not None
            done = [e.id for e in batch.entries]
            assert await drainer.inbox_take(key, "o", done=done, limit=5) is None
        assert await heard_by_now() == [], "a release nobody waits for sent a NOTIFY"

        # a waiter of another state flags the key: the release that ends the drain wakes it
        key = "flagged"
        ident = drainer._ids(key)[0].hex()
        mine.add(ident)
        await producer.inbox_accept(key, "x", claim=None, claim_ttl=60.0, max_pending=5)
        assert (await drainer.acquire(key, "o", 5.0)).token is not None
        assert (await waiter.acquire(key, "w", 5.0, waiting=True)).token is None
        entry = await drainer.inbox_step(key, "o")
        assert entry is not None
        assert await drainer.inbox_step(key, "o", done=entry.id) is None
        assert await heard_by_now() == [ident]
        assert (await waiter.acquire(key, "w", 5.0, waiting=True)).token is not None
    finally:
        await listener.close()


async def test_a_wake_up_reaches_one_worker_through_its_ear_without_a_notify(
    pg_clients: Clients,
) -> None:
    # Each NOTIFY costs every LISTENing session of the database a transaction (#24): the
    # hand-out's wake-up cancels the sleep of one worker's ear instead, and the worker claims the
    # key the waker wrote in its row. Woken well before the ear's own wait ends (EAR_WAIT).
    producer, serving = pg_clients.states[:2]
    heard: list[str] = []
    listener = await asyncpg.connect(POSTGRES.url)
    try:
        async with serving.inbox_worker(lock_ttl=30.0, with_entry=True) as worker:
            await listener.add_listener(worker.channel, lambda *a: heard.append(str(a[3])))
            assert await worker.next(0.0) is None  # its first claim: nothing yet
            for n in range(3):
                key = f"ear-{n}"
                waiting = asyncio.ensure_future(worker.next(10.0))
                await asyncio.sleep(0.05)  # the worker waits (its ear sleeps again)
                started = asyncio.get_running_loop().time()
                accepted = await producer.inbox_accept(
                    key, "x", claim=None, claim_ttl=60.0, max_pending=5
                )
                assert accepted.status == "accepted"
                grant = await waiting
                took = asyncio.get_running_loop().time() - started
                assert grant is not None
                assert grant.key == key
                assert took < 1.0, f"woken after {took:.2f} s: not by the ear"
                assert grant.entry is not None
                assert await serving.inbox_step(key, grant.owner, done=grant.entry.id) is None
            await listener.execute("SELECT 1")  # a NOTIFY would have arrived by now
            assert heard == [], "the hand-out's wake-up sent a NOTIFY"
    finally:
        await listener.close()


async def test_a_pid_that_is_no_ear_is_never_cancelled_and_the_worker_gets_a_notify(
    pg_clients: Clients,
) -> None:
    # A worker gone without saying so leaves a pid that may name another session by now; and a
    # waker may lack the right to cancel the ear (another role without pg_signal_backend). The
    # waker then cancels nothing and NOTIFYs the worker's channel: the wake-up still arrives.
    producer, serving = pg_clients.states[:2]
    prefix = serving._table_prefix
    other = await asyncpg.connect(POSTGRES.url)
    admin = await asyncpg.connect(POSTGRES.url)
    try:
        async with serving.inbox_worker(lock_ttl=30.0, with_entry=True) as worker:
            assert await worker.next(0.0) is None
            await admin.execute(
                f"UPDATE {prefix}inbox_workers SET ear = $1 WHERE id = $2",
                other.get_server_pid(),
                worker.id,
            )
            sleeping = asyncio.ensure_future(other.fetchval("SELECT pg_sleep(1.5)::text"))
            waiting = asyncio.ensure_future(worker.next(10.0))
            await asyncio.sleep(0.1)
            started = asyncio.get_running_loop().time()
            await producer.inbox_accept("no-ear", "x", claim=None, claim_ttl=60.0, max_pending=5)
            grant = await waiting
            took = asyncio.get_running_loop().time() - started
            assert grant is not None
            assert grant.key == "no-ear"
            assert took < 1.0, f"woken after {took:.2f} s: no NOTIFY came"
            assert await sleeping == "", "the waker cancelled a session that is no ear"
            assert grant.entry is not None
            assert await serving.inbox_step("no-ear", grant.owner, done=grant.entry.id) is None
    finally:
        await other.close()
        await admin.close()


async def test_a_wake_up_that_cancels_the_ear_before_its_accept_commits_is_not_lost(
    pg_clients: Clients,
) -> None:
    # Unlike a NOTIFY (delivered at commit), the ear's cancel acts at once, inside the accept's
    # transaction: the woken worker claims before the entry is committed. Its claim (and the
    # ear's next check) read the worker's row, which the waker holds locked until its commit:
    # they wait for it, and the key is taken right after the commit, not at the ear's next wait.
    # The accept's transaction is held open here for 0.5 s to make the race certain.
    serving = pg_clients.states[0]
    prefix = serving._table_prefix
    key = "in-flight"
    ident, full = serving._ids(key)
    conn = await asyncpg.connect(POSTGRES.url)
    try:
        async with serving.inbox_worker(lock_ttl=30.0, with_entry=True) as worker:
            assert await worker.next(0.0) is None
            waiting = asyncio.ensure_future(worker.next(10.0))
            await asyncio.sleep(0.1)
            loop = asyncio.get_running_loop()
            async with conn.transaction():
                status = await conn.fetchval(
                    f"SELECT status FROM {prefix}inbox_accept_v6($1, $2, $3, 'x', NULL, NULL,"
                    " 0, 5, 0)",
                    ident,
                    full,
                    serving._space,
                )
                assert status == "accepted"
                await asyncio.sleep(0.5)
                assert not waiting.done(), "a claim took an entry not committed yet"
            committed = loop.time()
            grant = await waiting
            took = loop.time() - committed
            assert grant is not None
            assert grant.key == key
            assert took < 1.0, f"taken {took:.2f} s after the commit: the wake-up was lost"
            assert grant.entry is not None
            assert await serving.inbox_step(key, grant.owner, done=grant.entry.id) is None
    finally:
        await conn.close()
