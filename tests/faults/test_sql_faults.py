"""PostgreSQL and MariaDB kill the sessions of live SQL states (issue #7).

The servers are the shared loopback ones of the backend matrix: nothing here stops a server
or touches a session of anyone else. Each test's states carry a tag of their own (an
``application_name`` on PostgreSQL, a user of their own on MariaDB, see ``_sql.py``), and the
injection is ``pg_terminate_backend`` / ``KILL`` of every session with that tag at once:

* ``TestKillAll``: while a holder (plain or auto-renewed) holds a lock and a waiter of another
  state waits for it: the pooled connections of both states, and on PostgreSQL the waiter
  state's LISTEN connection; then three times under a load of lock and dedupe calls.
* ``TestOutage``: the same kill, with a proxy in front of the holder's state that blackholes
  its reconnections for longer than the lock's TTL.
* ``TestInboxKill``: the sessions of a worker running ``serve()`` (on PostgreSQL its LISTEN
  connection too): an accept made afterwards is handled within seconds, not at the next rescan.
* ``TestWakeKill`` (MariaDB): the waiter's ear (blocked in ``GET_LOCK``) or the holder's bell
  (holding the key's wake name) alone: the waiter polls and is served promptly, and the push
  path comes back by itself.
* ``TestSemaphoreEarKill`` (MariaDB): a state's semaphore ear (in its marked ``GET_LOCK``): its
  waiter is woken to ask again, polls while the ear is down, and is pushed again once it is back.

Expected, on both servers:

* no call hangs past its timeout (every await is bounded); one that fails raises
  StateUnavailableError chained to the driver's error, never a driver error;
* the states recover by themselves: the next calls work, on new sessions; the PostgreSQL
  listener reconnects and LISTENs again on its own, and the blocked waiter is served (at worst
  once the holder's TTL ran out);
* with the server up, a statement that may safely run twice (inspect, acquire) never fails:
  a killed idle connection is replaced and the statement retried on a new one; only release
  and ``first_seen`` may surface the kill as StateUnavailableError;
* a holder whose lock expired during the outage learns it: ``LockNotOwnedError`` on release or
  extend, ``LockLostError`` with ``auto_renew``;
* ``Deduper.first_seen`` and ``claim`` fail with StateUnavailableError during the outage and
  work again after it.

Races are decided by conditions with deadlines (the waiter's row is flagged, a new LISTEN
session exists, a call succeeds again), never by sleeping. ``pytest -s`` prints the figures.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import (
    AsyncLock,
    Deduper,
    LockLostError,
    LockNotOwnedError,
    Semaphore,
    StateUnavailableError,
)
from asynclock._semaphore import contend as contend_module
from asynclock.state import SemaphoreState
from asynclock.state.mysql import _wake as wake_module
from asynclock.state.mysql._wake import wake_name
from asynclock.state.sql._queries import key_id
from tests._matrix import MYSQL, POSTGRES, require
from tests.faults._proxy import FaultProxy
from tests.faults._sql import SQLTarget
from tests.faults._timing import Call, bounded, timed, unexpected_failures, until
from tests.support.reporting import report

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from tests.faults._sql import AnySQLState

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

#: op_timeout / connect_timeout of the states under test
OP_TIMEOUT = 0.5
#: scheduling slack on a loaded machine, on top of a configured timeout or TTL
MARGIN = 0.3
#: past this, a call hangs: op_timeout covers its reconnection too, this leaves room to spare
CALL_BOUND = 2 * OP_TIMEOUT + MARGIN


@pytest.fixture(
    params=[
        pytest.param(POSTGRES, id="postgres", marks=pytest.mark.postgres),
        pytest.param(MYSQL, id="mysql", marks=pytest.mark.mysql),
    ]
)
async def sql(request: pytest.FixtureRequest) -> AsyncIterator[SQLTarget]:
    require(request.param)
    target = SQLTarget(request.param)
    await target.start()
    try:
        yield target
    finally:
        await target.aclose()


def open_state(sql: SQLTarget, port: int | None = None, **options: Any) -> AnySQLState:
    options.setdefault("op_timeout", OP_TIMEOUT)
    options.setdefault("connect_timeout", OP_TIMEOUT)
    return sql.open(port, **options)


async def serve(lock: AsyncLock) -> float:
    """Acquire ``lock`` (blocking), release it; the loop time it was acquired at.

    Runs as the waiter's own task: a lock belongs to the task that acquired it.
    """
    assert await lock.acquire()
    acquired_at = time.monotonic()
    await lock.release()
    return acquired_at


async def outcome(make: Callable[[], Awaitable[object]], what: str) -> BaseException | None:
    """Run one call within CALL_BOUND: ``None`` if it worked, else its StateUnavailableError.

    Any other exception (a raw driver error above all) fails the test.
    """
    try:
        await bounded(make(), what, CALL_BOUND)
    except StateUnavailableError as exc:
        failure = exc
    else:
        return None
    assert failure.__cause__ is not None, "the driver's error is not chained"
    return failure


async def assert_unavailable(make: Callable[[], Awaitable[object]], what: str) -> float:
    """``make()`` raises StateUnavailableError within op_timeout (+ MARGIN); the seconds taken."""
    start = time.monotonic()
    with pytest.raises(StateUnavailableError) as caught:
        await bounded(make(), what, CALL_BOUND + 1.0)
    elapsed = time.monotonic() - start
    assert elapsed <= OP_TIMEOUT + MARGIN, f"{what} took {elapsed:.3f} s to fail"
    assert caught.value.__cause__ is not None, "the driver's error is not chained"
    return elapsed


async def claim_once(dedupe: Deduper, event_id: str) -> bool:
    async with dedupe.claim(event_id) as fresh:
        return fresh


def works(make: Callable[[], Awaitable[object]]) -> Callable[[], Awaitable[bool]]:
    """A predicate for ``until``: the call succeeds (a StateUnavailableError: not yet)."""

    async def check() -> bool:
        return await outcome(make, "a call while recovering") is None

    return check


async def waiting(sql: SQLTarget, state: AnySQLState, key: str) -> None:
    """Until the waiter on ``state`` is registered: its row flagged, its LISTEN active."""

    async def registered() -> bool:
        if not await sql.flagged(state, key):
            return False
        return not sql.postgres or bool(await sql.listeners())

    await until(registered, "the waiter to register", within=3.0)


class TestKillAll:
    """Every session of the holder's and the waiter's states is killed at once."""

    #: long enough that the plain holder's lock outlives the kill, the recovery checks and the
    #: wait for a new LISTEN session on a loaded machine (each bounded by a few seconds): a
    #: lock that expired meanwhile would serve the waiter before the release under test
    HOLD_TTL = 6.0
    PROMPT = 1.0  # "promptly": well below HOLD_TTL

    @pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "renewing"])
    async def test_kill_while_held_and_waited(self, sql: SQLTarget, auto_renew: bool) -> None:
        a, b = open_state(sql), open_state(sql)
        key = "held"
        holder = AsyncLock(a, key, ttl=self.HOLD_TTL, auto_renew=auto_renew)
        holding, release = asyncio.Event(), asyncio.Event()

        async def hold() -> float:
            """Hold the lock (renewed: only ``async with`` renews) until told; release it."""
            async with holder:
                holding.set()
                await release.wait()
                return time.monotonic()

        held = asyncio.create_task(hold())
        await bounded(holding.wait(), "the holder's acquire", CALL_BOUND)
        # a waiter of another state (another process): only the server can tell it of a release
        waiter = AsyncLock(b, key, ttl=self.HOLD_TTL, timeout=10.0)
        served = asyncio.create_task(serve(waiter))
        await waiting(sql, b, key)
        sessions = await sql.sessions()
        listening = await sql.listeners() if sql.postgres else set()

        killed = await sql.kill_all()
        killed_at = time.monotonic()
        # a's pooled connection, b's pooled one, and on PostgreSQL b's LISTEN connection
        assert len(killed) >= (3 if sql.postgres else 2), (killed, sessions)
        assert listening <= killed

        # right after the kill: a statement that may run twice works (the dead connection is
        # replaced); first_seen may not run twice, so it may fail, as StateUnavailableError
        info = await bounded(a.inspect(key), "inspect after the kill", CALL_BOUND)
        assert info is not None
        expiry = time.monotonic() + info.remaining
        assert info.owner == holder.owner
        first_seen_failed = await outcome(
            lambda: Deduper(a).first_seen("after-kill"), "first_seen after the kill"
        )
        recovered = await until(
            works(lambda: b.inspect(key)), "the states to work again", within=3.0
        )
        relistened = 0.0
        if sql.postgres:

            async def listening_again() -> bool:
                return bool(await sql.listeners())

            # the listener reconnects and LISTENs again by itself
            await until(listening_again, "a new LISTEN session", within=3.0)
            relistened = time.monotonic() - killed_at
        renewed = 0.0
        if auto_renew:

            async def extended() -> bool:
                now = await a.inspect(key)
                return now is not None and time.monotonic() + now.remaining > expiry + 0.1

            # the renewer's next extend goes through on a new connection
            await until(extended, "a renewal after the kill", within=self.HOLD_TTL)
            renewed = time.monotonic() - killed_at
        assert not holder.lost
        assert not served.done(), f"the waiter stopped waiting: {served!r}"

        release.set()
        release_failed = await outcome(lambda: held, "the holder's release")
        acquired_at = await bounded(served, "the waiter", self.HOLD_TTL + 3.0)
        if release_failed is None:
            delay = acquired_at - held.result()
            assert delay <= self.PROMPT, f"served {delay:.3f} s after the release"
        else:
            # the release could not reach the server: the lock expires by its TTL
            delay = acquired_at - killed_at
            assert delay <= self.HOLD_TTL + MARGIN + CALL_BOUND
        assert (waiter.token or 0) > (holder.token or 0)

        # the same states keep working, on sessions opened after the kill
        dedupe = Deduper(b, namespace="after")
        assert await bounded(dedupe.first_seen("e1"), "first_seen", CALL_BOUND) is True
        assert await bounded(dedupe.first_seen("e1"), "first_seen again", CALL_BOUND) is False
        async with dedupe.claim("e2") as fresh:
            assert fresh
        new_sessions = await sql.sessions()
        assert new_sessions, "no session was opened after the kill"
        assert not new_sessions & killed
        report(
            f"kill-all[{sql.backend.name}, {'renewing' if auto_renew else 'plain'}]",
            killed=len(killed),
            first_seen="failed" if first_seen_failed else "ok",
            recovered_after=recovered,
            relisten_after=relistened,
            renewed_after=renewed,
            release="failed" if release_failed else "ok",
            waiter_delay=delay,
            new_sessions=len(new_sessions),
        )

    LOAD_TASKS = 6
    ROUNDS = 3

    async def test_kill_under_load(self, sql: SQLTarget) -> None:
        """Three kills of every session while six tasks inspect, lock and dedupe non-stop."""
        # more connections than tasks: a retry never queues for a connection handed back
        state = open_state(sql, max_connections=self.LOAD_TASKS + 4)
        calls: list[Call] = []
        stop = asyncio.Event()

        async def load(n: int) -> None:
            dedupe = Deduper(state, ttl=60.0, namespace=f"load{n}")
            round_ = 0
            while not stop.is_set():
                round_ += 1
                await timed(calls, "inspect", partial(state.inspect, f"load-{n}"))
                lock = AsyncLock(state, f"load-{n}", ttl=1.0)
                if await timed(calls, "acquire", partial(lock.acquire, blocking=False)):
                    await timed(calls, "release", lock.release)
                await timed(calls, "first_seen", partial(dedupe.first_seen, f"evt-{round_}"))

        def succeeded_since(moment: float, count: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return sum(c.error is None and c.start >= moment for c in calls) >= count

            return check

        loaders = [asyncio.create_task(load(n)) for n in range(self.LOAD_TASKS)]
        killed: list[int] = []
        recovered: list[float] = []
        try:
            await until(succeeded_since(0.0, 50), "the load to run", within=5.0)
            for _ in range(self.ROUNDS):
                killed.append(len(await sql.kill_all()))
                moment = time.monotonic()
                recovered.append(
                    await until(succeeded_since(moment, 50), "the load to recover", within=5.0)
                )
        finally:
            stop.set()
            await bounded(asyncio.gather(*loaders), "the load tasks", 5.0)

        failed = [c for c in calls if c.error is not None]
        unexpected = unexpected_failures(failed)
        assert not unexpected, unexpected[:5]
        # the server stayed up: a statement that may run twice is retried on a new connection,
        # so only those that may not (release, first_seen) can fail
        retried = [c for c in failed if c.name in ("inspect", "acquire")]
        assert not retried, retried[:5]
        longest = max(c.end - c.start for c in calls)
        assert longest <= OP_TIMEOUT + MARGIN, f"a call took {longest:.3f} s"
        assert min(killed) >= 1
        report(
            f"kill-under-load[{sql.backend.name}]",
            rounds=self.ROUNDS,
            killed=sum(killed),
            calls=len(calls),
            failed=len(failed),
            failed_kinds=",".join(sorted({c.name for c in failed})) or "-",
            recovered_max=max(recovered),
            longest_call=longest,
        )


class TestOutage:
    """The kill, with the way back blocked for longer than the lock's TTL.

    The holder's state reaches the server through a proxy; the proxy starts dropping every
    byte (new connections hang in their handshake) and then every session of the test is
    killed. The waiter's state reaches the server directly: it is killed too, but recovers at
    once, and takes the lock when the holder's TTL runs out.
    """

    TTL = 1.0

    @pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "renewing"])
    async def test_lock_expires_during_the_outage(self, sql: SQLTarget, auto_renew: bool) -> None:
        key = "held"
        async with FaultProxy(sql.port) as proxy:
            cut_off, direct = open_state(sql, proxy.port), open_state(sql)
            dedupe = Deduper(cut_off, namespace="outage")
            holding = asyncio.Event()
            seen: dict[str, Any] = {}
            holder = AsyncLock(cut_off, key, ttl=self.TTL, auto_renew=auto_renew)

            async def hold() -> None:
                try:
                    async with holder:
                        holding.set()
                        try:
                            await asyncio.Event().wait()
                        except asyncio.CancelledError:
                            seen["cancelled_at"] = time.monotonic()
                            raise
                except LockLostError as exc:
                    seen["lost"] = exc

            if auto_renew:
                holding_task = asyncio.create_task(hold())
                await bounded(holding.wait(), "the renewed holder", CALL_BOUND)
            else:
                assert await bounded(holder.acquire(), "the holder's acquire", CALL_BOUND)
            waiter = AsyncLock(direct, key, ttl=self.TTL, timeout=self.TTL + 5.0)
            served = asyncio.create_task(serve(waiter))
            await waiting(sql, direct, key)

            proxy.blackhole = True
            killed = await sql.kill_all()
            down_at = time.monotonic()
            assert len(killed) >= (3 if sql.postgres else 2), killed

            during: dict[str, Callable[[], Awaitable[object]]] = {
                "inspect": lambda: cut_off.inspect(key),
                "first_seen": lambda: dedupe.first_seen("during"),
                "claim": lambda: claim_once(dedupe, "during"),
                "acquire": lambda: AsyncLock(cut_off, "other", ttl=1.0).acquire(blocking=False),
            }
            if not auto_renew:
                during["extend"] = holder.extend
            surfaced = await asyncio.gather(
                *(assert_unavailable(call, name) for name, call in during.items())
            )

            # the holder's TTL runs out during the outage: the waiter takes the lock
            acquired_at = await bounded(served, "the waiter", self.TTL + CALL_BOUND + 2.0)
            takeover = acquired_at - down_at
            assert takeover <= self.TTL + MARGIN + CALL_BOUND
            assert (waiter.token or 0) > (holder.token or 0)
            if auto_renew:
                # renewals failed until the TTL ran out: the body was cancelled by then
                await bounded(holding_task, "the renewed holder's exit", self.TTL + CALL_BOUND)
                assert isinstance(seen.get("lost"), LockLostError), seen
                assert seen["cancelled_at"] - down_at <= self.TTL + MARGIN

            proxy.blackhole = False
            up_at = time.monotonic()
            recovered = await until(
                works(lambda: cut_off.inspect(key)), "the state to work again", within=5.0
            )
            if not auto_renew:
                # the holder learns that its lock expired during the outage
                with pytest.raises(LockNotOwnedError):
                    await bounded(holder.extend(), "extend after", CALL_BOUND)
                with pytest.raises(LockNotOwnedError):
                    await bounded(holder.release(), "release after", CALL_BOUND)
            assert holder.lost
            assert await bounded(dedupe.first_seen("after"), "first_seen after", CALL_BOUND)
            assert await bounded(claim_once(dedupe, "after-claim"), "claim after", CALL_BOUND)
            # the claim that failed during the outage recorded nothing
            assert await bounded(claim_once(dedupe, "during"), "claim again", CALL_BOUND)
            lock = AsyncLock(cut_off, key, ttl=self.TTL)
            assert await bounded(lock.acquire(blocking=False), "acquire after", CALL_BOUND)
            await bounded(lock.release(), "release after", CALL_BOUND)
        report(
            f"outage[{sql.backend.name}, {'renewing' if auto_renew else 'plain'}]",
            ttl=self.TTL,
            killed=len(killed),
            surfaced_max=max(surfaced),
            takeover_after=takeover,
            outage=up_at - down_at,
            recovered_after=recovered,
        )


class TestInboxKill:
    """Every session of a serving worker's state is killed: its inbox hears accepts again."""

    #: longer than the bound below: a worker that only found the event by its rescan fails
    LOCK_TTL = 30.0
    #: an accept after the kill is handled within this (a reconnected LISTEN, or MySQL's poll)
    PROMPT = 2.0

    async def test_a_worker_whose_sessions_are_killed_hears_accepts_again(
        self, sql: SQLTarget
    ) -> None:
        from asynclock import Event, EventDispatcher

        worker, webhook = open_state(sql), open_state(sql)
        handled: list[tuple[str, float]] = []
        bot = EventDispatcher(worker, on_lock_conflict="queue", lock_ttl=self.LOCK_TTL)

        @bot.on("*")
        async def handle(event: Event) -> None:
            handled.append((event.message_id or "", time.monotonic()))

        producer = EventDispatcher(webhook, on_lock_conflict="queue")
        serving = asyncio.create_task(bot.serve())
        try:
            await producer.accept(Event("message", "slack", "C1", "T1", "before"))
            await until(_true(lambda: len(handled) == 1), "the first event handled", within=3.0)
            if sql.postgres:
                assert await sql.listeners(), "the worker does not LISTEN"
            killed = await sql.kill_all()
            assert killed
            if sql.postgres:

                async def listening_again() -> bool:
                    return bool((await sql.listeners()) - killed)

                await until(listening_again, "the worker to LISTEN again", within=3.0)
            else:

                async def ear_waits_again() -> bool:
                    return bool(await sql.running("asynclock-inbox-ear"))

                # the accept comes once the reopened ear waits: the row must name its new id
                # by then, not at the lease's next renewal (the ear's whole wait later)
                await until(ear_waits_again, "the worker's ear to wait again", within=5.0)
            accepted_at = time.monotonic()
            await until(
                works(lambda: producer.accept(Event("message", "slack", "C1", "T1", "after"))),
                "an accept after the kill",
                within=3.0,
            )
            await until(
                _true(lambda: len(handled) == 2), "the accept after the kill handled", within=10.0
            )
            delay = handled[1][1] - accepted_at
            assert delay <= self.PROMPT, f"handled {delay:.2f} s after the accept"
            report(f"inbox-kill[{sql.backend.name}]", killed=len(killed), handled_after=delay)
        finally:
            await bot.aclose()
            await bounded(serving, "serve() to stop", CALL_BOUND + 3.0)

    async def test_a_worker_started_while_its_server_is_unreachable_serves_once_it_is_back(
        self, sql: SQLTarget, caplog: pytest.LogCaptureFixture
    ) -> None:
        # Joining the hand-out (registering the worker, listening) fails while the server is
        # out of reach: serve() rides it out and joins once it can, never ends early.
        from asynclock import Event, EventDispatcher

        handled: list[str] = []
        async with FaultProxy(sql.port) as proxy:
            proxy.blackhole = True
            worker, webhook = open_state(sql, proxy.port), open_state(sql)
            # the webhook's tables first: once the proxy opens, the worker makes its schema in one
            # transaction under the schema's lock, and an accept making its own at that moment
            # would wait for it longer than this test's 0.5 s op_timeout on a loaded machine
            await webhook.inspect("schema")
            bot = EventDispatcher(worker, on_lock_conflict="queue", lock_ttl=self.LOCK_TTL)

            @bot.on("*")
            async def handle(event: Event) -> None:
                handled.append(event.message_id or "")

            serving = asyncio.create_task(bot.serve())
            try:
                caplog.set_level("WARNING", logger="asynclock")

                def failed_to_join() -> bool:
                    return "joining the inbox's hand-out failed" in caplog.text

                await until(_true(failed_to_join), "a failed join logged", within=5.0)
                assert not serving.done(), "serve() ended while its server was out of reach"
                proxy.blackhole = False
                await EventDispatcher(webhook, on_lock_conflict="queue").accept(
                    Event("message", "slack", "C1", "T1", "back")
                )
                await until(_true(lambda: handled == ["back"]), "the event handled", within=10.0)
            finally:
                await bot.aclose()
                await bounded(serving, "serve() to stop", CALL_BOUND + 3.0)


@pytest.fixture
async def mysql_sql() -> AsyncIterator[SQLTarget]:
    require(MYSQL)
    target = SQLTarget(MYSQL)
    await target.start()
    try:
        yield target
    finally:
        await target.aclose()


async def handoff(sql: SQLTarget, holder: AnySQLState, waiter: AnySQLState, key: str) -> float:
    """Seconds from the holder's release to the waiting state's acquire.

    The holder releases once the waiter's blocking acquire has flagged the key (not after a
    fixed pause, which a loaded machine can outlast), so the release always finds the flag."""
    holding, go = asyncio.Event(), asyncio.Event()

    async def keep() -> float:
        async with AsyncLock(holder, key, ttl=TestWakeKill.HOLD_TTL):
            holding.set()
            await go.wait()
            return time.monotonic()

    held = asyncio.create_task(keep())
    await bounded(holding.wait(), "the holder's acquire", CALL_BOUND)
    served = asyncio.create_task(serve(AsyncLock(waiter, key, ttl=TestWakeKill.HOLD_TTL)))

    async def waiter_flagged() -> bool:
        return await sql.flagged(waiter, key)

    await until(waiter_flagged, "the waiter's flag on the key", within=CALL_BOUND)
    go.set()
    released_at = await bounded(held, "the holder's release", CALL_BOUND)
    return await bounded(served, "the waiter", TestWakeKill.HOLD_TTL + MARGIN) - released_at


class TestWakeKill:
    """MySQL: the sessions of the push path (the waiter's ear, the holder's bell) are killed.

    The ear blocks in ``GET_LOCK`` of the key's wake name, which the holder's bell holds. Killed,
    either one must leave the waiter polling (served within ``PROMPT`` of the release, never at
    the TTL), and the push path must come back by itself (a later handoff within 50 ms).
    """

    HOLD_TTL = 6.0
    PROMPT = 1.0  # the polling back-off is at most 0.1 s: this is slack for a loaded machine

    @pytest.mark.parametrize("victim", ["ear", "bell"])
    async def test_a_killed_wake_session_falls_back_and_recovers(
        self, mysql_sql: SQLTarget, victim: str
    ) -> None:
        sql = mysql_sql
        a, b = open_state(sql), open_state(sql)
        key = "woken"
        name = wake_name(a.table_prefix, key_id(a.prefix + key).hex())
        # a learns that another state waits for the key (its release finds b's flag): from now
        # on its bell holds the key's wake name while it holds the key
        await handoff(sql, a, b, key)
        holding, go = asyncio.Event(), asyncio.Event()

        async def keep() -> float:
            async with AsyncLock(a, key, ttl=self.HOLD_TTL):
                holding.set()
                await go.wait()
                return time.monotonic()

        held = asyncio.create_task(keep())
        await bounded(holding.wait(), "the holder's acquire", CALL_BOUND)

        async def bell_holds() -> bool:
            return await sql.lock_holder(name) is not None

        # the waiter starts once the bell holds the name: an ear's look takes a free name for
        # an instant, and a bell's GET_LOCK(name, 0) landing in that instant does not hold it
        # for this holding (documented: the waiter polls), which is not the path killed here
        await until(bell_holds, "the bell to hold the wake name", within=CALL_BOUND)
        served = asyncio.create_task(serve(AsyncLock(b, key, ttl=self.HOLD_TTL)))

        sessions: dict[str, int] = {}

        async def bell_holds_and_ear_listens() -> bool:
            # both seen in one look: the sessions killed below are the ones seen here, so
            # a bell that dropped and took the name again meanwhile is not mistaken for none
            bell = await sql.lock_holder(name)
            ears = await sql.running("IS_FREE_LOCK")
            if bell is None or len(ears) != 1:
                return False
            sessions["bell"], (sessions["ear"],) = bell, ears
            return True

        await until(
            bell_holds_and_ear_listens,
            "the bell to hold the wake name and the ear to wait on it",
            within=3.0,
        )
        session = sessions[victim]
        await sql.kill(session)
        go.set()
        released_at = await bounded(held, "the holder's release", CALL_BOUND)
        delay = await bounded(served, "the waiter", self.HOLD_TTL + MARGIN) - released_at
        assert delay <= self.PROMPT, f"served {delay:.2f} s after the release"

        fast: list[float] = []

        async def pushed_again() -> bool:
            fast.append(await handoff(sql, a, b, key))
            return fast[-1] < 0.05

        # the dropped connection is reopened (at most once a second) and rings again
        await until(pushed_again, "a pushed handoff after the kill", within=10.0)
        report(f"wake-kill[{victim}]", served_after=delay, pushed_handoff=fast[-1], tries=len(fast))


def _true(check: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """``check`` as a predicate for ``until``."""

    async def predicate() -> bool:
        return check()

    return predicate


async def semaphore_handoff(holder: AnySQLState, waiter: AnySQLState, key: str) -> float:
    """Seconds from the holder's release to the other state's waiter taking the permit."""
    permit = Semaphore(holder, key, limit=1, ttl=10.0)
    assert await permit.acquire(blocking=False)
    entered: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(take_permit(waiter, key, entered))
    await until(partial(queued, holder, key), "the waiter's place", within=5.0, interval=0.005)
    released = time.monotonic()
    await permit.release()
    await bounded(waiting, "the waiter", 5.0)
    return entered.result() - released


async def take_permit(state: AnySQLState, key: str, entered: asyncio.Future[float]) -> None:
    """Take a permit of ``key`` (limit 1), telling when."""
    async with Semaphore(state, key, limit=1, ttl=10.0, timeout=10.0):
        entered.set_result(time.monotonic())


async def queued(state: AnySQLState, key: str) -> bool:
    """Whether a waiter has its place in the queue of semaphore ``key``."""
    assert isinstance(state, SemaphoreState)
    return (await state.semaphore_inspect(key)).waiting > 0


class TestSemaphoreEarKill:
    """MariaDB: the semaphore waiters' ear of a state dies (``KILL CONNECTION``).

    The states run as a user of their own with no server privilege, as an application would:
    the release's ``KILL QUERY`` reaches the ear because it is a session of the same user.
    Killing the ear's whole session drops its state's push path: the waiter is woken at once to
    ask again (it may have missed a release), polls while the ear is down, and is pushed again
    once the ear is back (reopened at most once a second).
    """

    #: served within this of the release while the ear is down (polling: 100 ms at most
    #: between looks, plus a loaded machine's margin); a waiter left waiting would take 1.7 s
    PROMPT = 0.6
    #: a pushed handoff, on a loaded machine: once the ear is back, polling and the place's
    #: refresh are slowed to 30 s, so nothing but the push serves the waiter this soon (a
    #: missed push leaves it waiting for the holder's 10 s TTL, past ``semaphore_handoff``'s
    #: bound)
    PUSHED = 1.0

    async def test_a_killed_ear_falls_back_to_polling_and_pushes_again(
        self, mysql_sql: SQLTarget, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        sql = mysql_sql
        a, b = open_state(sql), open_state(sql)
        assert await semaphore_handoff(a, b, "k") < 1.0  # b's ear is open
        permit = Semaphore(a, "k", limit=1, ttl=10.0)
        assert await permit.acquire(blocking=False)
        entered: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiting = asyncio.create_task(take_permit(b, "k", entered))
        ears: set[int] = set()

        async def ear_waits() -> bool:
            ears.update(await sql.running("asynclock-semaphore-ear"))
            return len(ears) == 1 and await queued(a, "k")

        await until(ear_waits, "b's ear to wait and its waiter to queue", within=5.0)
        (ear,) = ears
        await sql.kill(ear)
        await asyncio.sleep(0.05)  # the waiter, woken by the lost ear, asks again and polls
        released = time.monotonic()
        await permit.release()
        delay = await bounded(entered, "the waiter", 5.0) - released
        await bounded(waiting, "the waiter's release", CALL_BOUND)
        assert delay <= self.PROMPT, f"served {delay:.2f} s after the release"

        async def ear_back() -> bool:
            return bool(await sql.running("asynclock-semaphore-ear"))

        back = await until(ear_back, "b's ear to be reopened", within=5.0)
        # polling and the place's refresh slowed down to 30 s: only the push meets the bound now
        monkeypatch.setattr(wake_module, "FIRST_POLL", 30.0)
        monkeypatch.setattr(wake_module, "MAX_POLL", 30.0)
        monkeypatch.setattr(contend_module, "PLACE_REFRESH", 30.0)
        pushed = await semaphore_handoff(a, b, "k")
        assert pushed < self.PUSHED, f"served {pushed:.3f} s after the release"
        report("semaphore-ear-kill", served_after=delay, ear_back_after=back, pushed=pushed)
