"""PostgresState's claims: the row lock order of the statements that carry a dedupe claim.

``acquire_claimed`` and ``release_claimed`` each lock two rows, the claim's dedupe row and the
key's lock row. If one took them in the opposite order of the other, a release of event A's lock
and an acquire recording the same (lapsed) claim A would wait for each other: the server breaks
the cycle after ``deadlock_timeout`` by rolling one back, and every statement on the key and the
claim waits meanwhile (docs/decisions.md, "PostgreSQL claims"). Each test row-locks one of the two
rows from a session of its own, starts the statement, and checks which rows it holds while it
waits: never the lock row while it waits for the dedupe row. The last test replays the cycle
itself (a release racing its lock's expiry, a redelivery taking the lapsed claim over): with the
two orders opposed it ends in ``DeadlockDetectedError`` after one second.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING, Any

import asyncpg  # type: ignore[import-untyped]
import pytest

from asynclock import state_from_url
from asynclock.state import ClaimingState
from asynclock.state.sql._queries import key_id
from tests._matrix import POSTGRES, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

pytestmark = pytest.mark.postgres


class Rows:
    """A state on a fresh namespace, and a session of its own that row-locks its rows."""

    def __init__(self, state: Any, prefix: str, session: Any, tag: str) -> None:
        self.state = state
        self.prefix = prefix
        self.session = session
        #: the application_name of every session of this test's states (waiting_for_a_row)
        self.tag = tag

    def open(self, **options: Any) -> Any:
        """Another state of this namespace, its sessions tagged as this test's."""
        return state_from_url(
            POSTGRES.url, prefix=self.prefix, application_name=self.tag, **options
        )

    def ident(self, key: str) -> bytes:
        return key_id(f"{self.prefix}{key}")

    @contextlib.asynccontextmanager
    async def holding_claim(self, claim: str) -> AsyncIterator[None]:
        """Hold the row lock of ``claim``'s dedupe record in an open transaction."""
        async with self.session.transaction():
            row = await self.session.fetchval(
                "SELECT 1 FROM asynclock_dedupe WHERE id = $1 FOR UPDATE", self.ident(claim)
            )
            assert row == 1, f"no dedupe row for {claim!r}"
            yield

    async def lapse(self, claim: str) -> None:
        """Let ``claim``'s dedupe record lapse now (as if its lease ran out)."""
        await self.session.execute(
            "UPDATE asynclock_dedupe SET expires_at = now() - interval '1 s' WHERE id = $1",
            self.ident(claim),
        )

    async def lock_row_is_free(self, key: str) -> bool:
        """Whether nobody holds the row lock of ``key``'s lock row (asked without waiting)."""
        try:
            async with self.session.transaction():
                await self.session.execute("SET LOCAL lock_timeout = '1ms'")
                await self.session.execute(
                    "SELECT 1 FROM asynclock_locks WHERE id = $1 FOR UPDATE", self.ident(key)
                )
        except asyncpg.LockNotAvailableError:
            return False
        return True

    async def waiting_for_a_row(self, task: asyncio.Task[Any], sessions: int = 1) -> None:
        """Until ``sessions`` other sessions wait for a row lock (``task``'s statement among them)."""
        for _ in range(500):
            assert not task.done(), task
            # inside the holding transaction the activity view is read once, unless cleared
            await self.session.execute("SELECT pg_stat_clear_snapshot()")
            # only this test's sessions: another test's statement waiting for a row lock of its
            # own (or a purge waiting for one of these rows) must not count
            waiting = await self.session.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                "AND wait_event_type = 'Lock'",
                self.tag,
            )
            if waiting >= sessions:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the statement never waited for the dedupe row")


@pytest.fixture
async def rows() -> AsyncIterator[Rows]:
    require(POSTGRES)
    namespace = uuid.uuid4().hex
    options = POSTGRES.options(namespace)
    tag = f"asynclock_c_{namespace[:16]}"
    state = state_from_url(POSTGRES.url, application_name=tag, **options)
    session = await asyncpg.connect(POSTGRES.url, timeout=10)
    try:
        assert isinstance(state, ClaimingState)
        yield Rows(state, str(options["prefix"]), session, tag)
    finally:
        await session.close()
        await state.aclose()
        await purge_namespace(POSTGRES, namespace)


async def _while_claim_held(rows: Rows, claim: str, key: str, statement: Awaitable[Any]) -> Any:
    """Run ``statement`` while ``claim``'s row is locked; ``key``'s lock row must stay free."""
    async with rows.holding_claim(claim):
        task = asyncio.ensure_future(statement)
        await rows.waiting_for_a_row(task)
        assert await rows.lock_row_is_free(key), "the lock row was locked before the claim's"
    return await asyncio.wait_for(task, 10.0)


async def test_release_claimed_locks_the_claim_before_the_lock(rows: Rows) -> None:
    state = rows.state
    grant = await state.acquire_claimed("k", "a", 30.0, claim="c", claim_ttl=30.0)
    assert grant is not None
    assert grant.token is not None
    release = state.release_claimed("k", "a", claim="c", claim_ttl=600.0)
    result = await _while_claim_held(rows, "c", "k", release)
    assert result.owned
    assert await state.inspect("k") is None
    remaining = await state.dedupe_remaining("c")
    assert remaining is not None
    assert remaining > 500  # marked done by the release


async def test_acquire_claimed_locks_the_claim_before_the_lock(rows: Rows) -> None:
    state = rows.state
    await state.acquire("k", "before", 30.0)  # the lock row exists, free again after
    assert (await state.release("k", "before")).owned
    await state.dedupe_keep("c", 0.3)
    async with rows.holding_claim("c"):
        # the claim's lease lapses while its row is locked here, so no other state's purge (they
        # delete every expired row of the table) can take the row before the acquire below
        await asyncio.sleep(0.4)
        task = asyncio.ensure_future(
            state.acquire_claimed("k", "a", 30.0, claim="c", claim_ttl=30.0)
        )
        await rows.waiting_for_a_row(task)
        assert await rows.lock_row_is_free("k"), "the lock row was locked before the claim's"
    grant = await asyncio.wait_for(task, 10.0)
    assert grant is not None  # None would be "a live claim: duplicate"
    assert grant.token is not None
    assert await state.forget_claimed("c", "a")  # recorded as a's claim


async def test_a_release_racing_its_expiry_and_a_redelivery_never_deadlock(
    rows: Rows, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scenario of the earlier attempt's deadlock: the lock of event "c" expires while its
    # release waits for the lock row (a stall), the claim's lease has lapsed with it, and a
    # redelivery's acquire_claimed takes the claim over and wants the (expired) lock row.
    # Deadlock victims are not run again here, so a cycle would surface as an error.
    monkeypatch.setattr(type(rows.state), "_rolled_back_whole", lambda self, exc: False)
    first: Any = rows.state
    second: Any = rows.open()
    try:
        grant = await first.acquire_claimed("k", "a", 0.3, claim="c", claim_ttl=30.0)
        assert grant is not None
        assert grant.token is not None
        await rows.lapse("c")
        async with rows.session.transaction():  # the stall: the lock row is held elsewhere
            await rows.session.execute(
                "SELECT 1 FROM asynclock_locks WHERE id = $1 FOR UPDATE", rows.ident("k")
            )
            release = asyncio.ensure_future(
                first.release_claimed("k", "a", claim="c", claim_ttl=600.0)
            )
            await rows.waiting_for_a_row(release)
            await asyncio.sleep(0.4)  # the lock's 0.3 s run out while its release waits
            assert await first.inspect("k") is None
            redelivery = asyncio.ensure_future(
                second.acquire_claimed("k", "b", 30.0, claim="c", claim_ttl=30.0)
            )
            await rows.waiting_for_a_row(redelivery, sessions=2)
        assert (await asyncio.wait_for(release, 10.0)).owned  # its statement began in time
        assert await asyncio.wait_for(redelivery, 10.0) is None  # "c" is done: a duplicate
    finally:
        await second.aclose()


async def test_an_accept_taking_over_a_lapsed_claim_keeps_it_from_the_old_owner(
    rows: Rows,
) -> None:
    # A dispatch's claim lapses (its worker stalled) and an accept of a redelivery takes the
    # claim over: the record is the accept's now, so the stalled dispatcher's late
    # forget_claimed must not delete it, or the next redelivery would be accepted a second time
    # (inbox_accept_v1 kept the old owner on the record it took over).
    # no background purge of this state may delete the lapsed record before the accept
    state: Any = rows.open(purge_interval=None)
    try:
        grant = await state.acquire_claimed("k", "a", 30.0, claim="c", claim_ttl=30.0)
        assert grant is not None
        assert grant.token is not None
        await rows.lapse("c")
        first = await state.inbox_accept("in", "c, again", claim="c", claim_ttl=60.0, max_pending=9)
        assert first.status == "accepted"
        assert not await state.forget_claimed("c", "a")  # no longer a's claim
        again = await state.inbox_accept("in", "c, again", claim="c", claim_ttl=60.0, max_pending=9)
        assert again.status == "duplicate"
    finally:
        await state.aclose()
