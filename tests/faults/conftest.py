"""Fixtures of the fault tests: a throwaway Redis server per test and states that use it.

* ``redis_server``: a :class:`RedisServer` of this test alone (free loopback port, nothing
  persisted), stopped afterwards. Without ``redis-server`` on PATH the test is skipped locally
  and fails in CI (``CI=true``), like the backend matrix.
* ``admin``: a plain redis-py client of that server, for CLIENT KILL / CLIENT PAUSE / PUBSUB.
* ``open_state``: builds RedisStates on it (short timeouts by default) and closes them after
  the test.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import pytest
from redis.asyncio import Redis

from asynclock import RedisState
from tests.faults._server import RedisServer
from tests.support.servers import require_binary

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterator

#: op_timeout / connect_timeout of the states under test unless a test says otherwise
OP_TIMEOUT = 0.5


def throwaway_redis(*, durable: bool = False) -> Iterator[RedisServer]:
    """Start a throwaway server, yield it, stop it (the body of the server fixtures).

    ``durable``: it keeps an append-only file fsynced on every write (see ``_server.py``).
    """
    binary = require_binary("redis-server", "the fault tests start their own servers")
    server = RedisServer(binary, durable=durable)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    yield from throwaway_redis()


@pytest.fixture
async def admin(redis_server: RedisServer) -> AsyncIterator[Redis]:
    # its own short timeouts: an admin call during an outage must not hang the test either
    client = Redis(
        host="127.0.0.1",
        port=redis_server.port,
        socket_timeout=5.0,
        socket_connect_timeout=2.0,
    )
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"faults-{uuid.uuid4().hex[:8]}:"


@pytest.fixture
async def open_state(
    redis_server: RedisServer, prefix: str
) -> AsyncIterator[Callable[..., RedisState]]:
    opened: list[RedisState] = []

    def make(url: str | None = None, **options: Any) -> RedisState:
        options.setdefault("op_timeout", OP_TIMEOUT)
        options.setdefault("connect_timeout", OP_TIMEOUT)
        options.setdefault("prefix", prefix)
        state = RedisState.from_url(url or redis_server.url, **options)
        opened.append(state)
        return state

    yield make
    for state in opened:
        await state.aclose()
