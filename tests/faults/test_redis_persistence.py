"""The durable inbox on a Redis that keeps no append-only file: one warning per state (#30).

On throwaway servers of this test alone, one started without AOF and one with
``appendonly yes``: ``INFO commandstats`` there counts this test's commands only, so it shows
that the check is one ``INFO`` per state, started in the background by the first ``accept`` or
``serve()`` (``aclose()`` waits for it), and that every accept is the one ``EVALSHA`` it was
before.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from asynclock import Event, EventDispatcher, HandlerContext, RedisState, StateUnavailableError
from asynclock.state import DurabilityCheck
from asynclock.state.redis._durability import aof_enabled
from tests._helpers import eventually
from tests.faults.conftest import throwaway_redis

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

    from tests.faults._server import RedisServer

pytestmark = [pytest.mark.faults, pytest.mark.timeout(60)]

EVENTS = 5
#: op_timeout and connect_timeout of the states whose commands are counted: with the fault
#: tests' 0.5 s, 50 connections opened at once on a loaded machine timed out, and a check that
#: timed out (rightly) ran again at the next accept
ROOMY = 30.0


@pytest.fixture
def durable_server() -> Iterator[RedisServer]:
    yield from throwaway_redis(durable=True)


@pytest.fixture
async def durable_admin(durable_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis(host="127.0.0.1", port=durable_server.port, socket_timeout=5.0)
    try:
        yield client
    finally:
        await client.aclose()


async def _commands(admin: Redis) -> Counter[str]:
    """Commands run so far by name; ``evalsha`` without those a fresh server answered with
    NOSCRIPT (each is followed by a ``SCRIPT LOAD`` and the same EVALSHA again)."""
    stats = await admin.info("commandstats")
    calls = Counter({name.removeprefix("cmdstat_"): int(s["calls"]) for name, s in stats.items()})
    calls["evalsha"] -= calls["script|load"]
    return calls


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "asynclock" and r.levelno >= logging.WARNING
    ]


def _event(n: int) -> Event:
    return Event("message", "test", "C1", "T1", f"m{n}")


async def _accept_some(state: RedisState) -> EventDispatcher:
    """A dispatcher on ``state`` that accepted ``EVENTS`` events, and closed: its check done."""
    bot = EventDispatcher(state, on_lock_conflict="queue")
    for n in range(EVENTS):
        assert await bot.accept(_event(n)) == "accepted"
    await bot.aclose()
    return bot


async def test_a_server_without_aof_gets_one_warning_per_state_and_one_info(
    open_state: Callable[..., RedisState], admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asynclock")
    state = open_state(op_timeout=ROOMY, connect_timeout=ROOMY)
    assert isinstance(state, DurabilityCheck)
    before = await _commands(admin)
    await _accept_some(state)
    # a second dispatcher on the same state, and its serve(): the state checked already
    handled: list[str] = []
    other = EventDispatcher(state, on_lock_conflict="queue")

    @other.on("message")
    async def record(event: Event, ctx: HandlerContext) -> None:
        handled.append(str(event.message_id))

    worker = asyncio.create_task(other.serve())
    assert await other.accept(_event(EVENTS)) == "accepted"

    async def all_handled() -> bool:
        return len(handled) == EVENTS + 1

    await eventually(all_handled, within=10.0)
    await other.aclose()
    await worker
    spent = await _commands(admin) - before
    # one INFO by the state, one by the `before` reading above; each accept one EVALSHA
    # (the steps of the drain are EVALSHAs too: at least one per event)
    assert spent["info"] == 1 + 1, spent
    assert spent["evalsha"] >= 2 * (EVENTS + 1), spent
    [warning] = _warnings(caplog)
    assert "aof_enabled:0" in warning
    assert "appendonly yes" in warning
    assert "appendfsync" in warning
    assert "check_persistence=False" in warning
    assert f"127.0.0.1:{admin.connection_pool.connection_kwargs['port']}" in warning
    later = EventDispatcher(state, on_lock_conflict="queue")  # settled: nothing more
    assert await later.accept(_event(99)) == "accepted"
    await later.aclose()
    assert len(_warnings(caplog)) == 1
    # another state instance checks (and warns) once more
    await _accept_some(
        open_state(op_timeout=ROOMY, connect_timeout=ROOMY, prefix=f"{state.prefix}second:")
    )
    assert len(_warnings(caplog)) == 2


async def test_the_first_accept_checks_once_however_many_run_at_once(
    open_state: Callable[..., RedisState], admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asynclock")
    state = open_state(op_timeout=ROOMY, connect_timeout=ROOMY)
    # the scripts loaded beforehand (by the state itself, not by a dispatcher: no check yet)
    await state.inbox_accept("warm", "{}", claim=None, claim_ttl=5.0, max_pending=5)
    bot = EventDispatcher(state, on_lock_conflict="queue")
    before = await _commands(admin)
    outcomes = await asyncio.gather(*(bot.accept(_event(n)) for n in range(50)))
    assert set(outcomes) == {"accepted"}
    await asyncio.gather(*(bot.accept(_event(n)) for n in range(50, 60)))
    await bot.aclose()
    spent = await _commands(admin) - before
    assert spent["info"] == 1 + 1, spent
    assert spent["evalsha"] == 60, spent
    assert len(_warnings(caplog)) == 1


async def test_check_persistence_false_sends_nothing_and_warns_nothing(
    open_state: Callable[..., RedisState], admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asynclock")
    state = open_state(op_timeout=ROOMY, connect_timeout=ROOMY, check_persistence=False)
    before = await _commands(admin)
    await _accept_some(state)
    spent = await _commands(admin) - before
    assert spent["info"] == 1, spent  # the `before` reading alone
    assert spent["evalsha"] == EVENTS, spent
    assert _warnings(caplog) == []
    with pytest.raises(TypeError, match="check_persistence"):
        RedisState.from_url("redis://127.0.0.1:1", check_persistence="no")  # type: ignore[arg-type]


async def test_the_check_never_delays_an_accept_on_a_stalled_server(
    open_state: Callable[..., RedisState], admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # the first accept starts the check and does not wait for it: on a server that stalls, the
    # accept itself raises within op_timeout (0.5 s here), not after the check's op_timeout too
    caplog.set_level(logging.INFO, logger="asynclock")
    state = open_state()
    bot = EventDispatcher(state, on_lock_conflict="queue")
    await state.inbox_ready()  # a connection open before the pause
    await admin.client_pause(1500, all=True)
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(StateUnavailableError):
        await bot.accept(_event(0))
    assert loop.time() - began < 0.5 + 0.4
    await bot.aclose()  # the check gave up too (not settled: asked again by the next accept)
    assert _warnings(caplog) == []
    await eventually(_unpaused(admin), within=5.0)
    again = EventDispatcher(state, on_lock_conflict="queue")
    assert await again.accept(_event(1)) == "accepted"
    await again.aclose()
    assert len(_warnings(caplog)) == 1


def _unpaused(admin: Redis) -> Callable[[], Awaitable[bool]]:
    async def answers() -> bool:
        return bool(await admin.ping())

    return answers


async def test_a_server_with_aof_gets_no_warning(
    durable_server: RedisServer, durable_admin: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="asynclock")
    state = RedisState.from_url(durable_server.url, prefix="durable:", op_timeout=2.0)
    try:
        before = await _commands(durable_admin)
        await _accept_some(state)
        spent = await _commands(durable_admin) - before
        assert spent["info"] == 1 + 1, spent  # checked, once
        assert _warnings(caplog) == []
        said = [r.getMessage() for r in caplog.records if r.name == "asynclock"]
        assert [m for m in said if "persistence" in m or "aof" in m] == []
    finally:
        await state.aclose()


async def test_a_server_out_of_reach_is_checked_once_it_answers(
    redis_server: RedisServer,
    open_state: Callable[..., RedisState],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="asynclock")
    state = open_state(op_timeout=ROOMY, connect_timeout=ROOMY)
    redis_server.stop()
    assert await state.check_durability() is False  # not settled: asked again later
    assert _warnings(caplog) == []
    redis_server.start()
    assert await state.check_durability() is True
    assert len(_warnings(caplog)) == 1
    assert await state.check_durability() is True  # settled: no second warning
    assert len(_warnings(caplog)) == 1


def test_aof_enabled_reads_the_info_text() -> None:
    assert aof_enabled(b"# Persistence\r\nloading:0\r\naof_enabled:0\r\n") is False
    assert aof_enabled("# Persistence\naof_enabled:1\naof_rewrite_in_progress:0") is True
    assert aof_enabled(b"# Persistence\r\nloading:0\r\n") is None
