"""Redis: a connection the pool gives up is closed at once, not in a task that may never run.

A task made at the end of a program or a test is cancelled before its first step when the loop
ends; a connection left to it kept its socket open, and warned when collected (in a later test,
under ``filterwarnings = error``).
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from asynclock.state.redis._pool import LeanPool
from tests._matrix import REDIS, require

pytestmark = pytest.mark.redis


async def test_a_broken_connection_is_closed_before_the_pool_returns() -> None:
    require(REDIS)
    client = Redis.from_url(REDIS.url)
    pool = LeanPool(lambda: client.connection_pool.make_connection(), 2)
    try:
        assert await pool.call("PING") in (b"PONG", "PONG", True)
        conn, reused = await pool.checkout()
        assert reused
        assert conn.is_connected
        pool.checkin(conn, broken=True)  # as an interrupted exchange does
        if hasattr(conn, "_close"):  # redis-py >= 5.1 can close without awaiting
            assert not conn.is_connected
        await asyncio.sleep(0)  # an older redis-py: its task has run its first step
        assert not conn.is_connected
    finally:
        await pool.aclose()
        await client.aclose()
