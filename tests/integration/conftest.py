"""Fixtures of the integration tests: a fresh Redis namespace the apps under test share."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from tests._matrix import REDIS, purge_namespace, require

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    """A namespace no other test uses on the Redis server; its keys are deleted afterwards."""
    require(REDIS)
    made = uuid.uuid4().hex
    yield made
    await purge_namespace(REDIS, made)


@pytest.fixture
def prefix(namespace: str) -> str:
    """The ``prefix=`` of ``state_from_url`` that puts a state in the test's namespace."""
    return str(REDIS.options(namespace)["prefix"])


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    """A plain client of the test Redis server (to read what the workers wrote)."""
    client = Redis.from_url(REDIS.url)
    yield client
    await client.aclose()
