"""Owner ids are unguessable and per acquisition; prefixes keep applications apart (issue #7)."""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from asynclock import AsyncLock, Deduper, LockNotOwnedError, MemoryState, state_from_url
from asynclock._owner import new_owner
from tests._matrix import TEST_PREFIX, purge_namespace

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock import State
    from tests._matrix import Backend

pytestmark = pytest.mark.security

#: "<host>:<pid>:<task id>:<random>"; the random part is 16 hex digits (64 bits, secrets)
OWNER = re.compile(r"^(?P<host>[^\s|]+):(?P<pid>\d+):(?P<task>[0-9a-f]+):(?P<random>[0-9a-f]{16})$")
SAMPLE = 100_000


class TestOwnerIds:
    def test_100k_ids_are_unique_with_64_random_bits(self) -> None:
        randoms = []
        for _ in range(SAMPLE):
            match = OWNER.match(new_owner())
            assert match is not None
            randoms.append(int(match["random"], 16))
        assert len(set(randoms)) == SAMPLE, "an owner id repeated"
        # every one of the 64 bits is set in about half the ids: 50% +- 1% is > 6 sigma wide
        for bit in range(64):
            ones = sum((value >> bit) & 1 for value in randoms)
            assert 0.49 < ones / SAMPLE < 0.51, (bit, ones)
        assert max(randoms).bit_length() == 64

    async def test_public_owner_has_the_format_and_is_fresh_per_acquisition(self) -> None:
        state = MemoryState()
        owners: list[str] = []
        lock = AsyncLock(state, "k", ttl=5.0)
        for _ in range(2_000):
            async with lock:
                owners.append(lock.owner)
        assert len(set(owners)) == len(owners), "one object reused an owner id"
        assert all(OWNER.match(owner) for owner in owners)

    async def test_a_copied_owner_cannot_release_or_extend_another_acquisition(
        self, state: State
    ) -> None:
        holder = AsyncLock(state, "victim", ttl=30.0)
        assert await holder.acquire()
        intruder = AsyncLock(state, "victim", ttl=30.0)
        # the owner is not settable: it is made by each acquisition
        anything: Any = intruder
        with pytest.raises(AttributeError):
            anything.owner = holder.owner
        # even a copy forced into the lock's private engine is replaced by the next acquisition
        anything._engine.owner = holder.owner
        with pytest.raises((RuntimeError, LockNotOwnedError)):
            await intruder.release()
        with pytest.raises((RuntimeError, LockNotOwnedError)):
            await intruder.extend()
        assert not await intruder.acquire(blocking=False)
        assert intruder.owner != holder.owner, "an acquisition reused a copied owner"
        with pytest.raises((RuntimeError, LockNotOwnedError)):
            await intruder.release()
        info = await state.inspect("victim")
        assert info is not None
        assert info.owner == holder.owner
        await holder.release()

    async def test_a_guessed_owner_cannot_release_through_the_state(self, state: State) -> None:
        # The State API takes an owner: a guess that shares host, pid and task but not the
        # random part is just another owner.
        holder = AsyncLock(state, "victim", ttl=30.0)
        assert await holder.acquire()
        prefix, _, random = holder.owner.rpartition(":")
        guesses = [f"{prefix}:{'0' * 16}", f"{prefix}:{random[::-1]}", prefix, holder.owner + "x"]
        for guess in guesses:
            answer = await state.release("victim", guess)
            assert not answer.owned, guess
            assert not await state.extend("victim", guess, 60.0), guess
        info = await state.inspect("victim")
        assert info is not None
        assert info.owner == holder.owner
        await holder.release()
        assert not await AsyncLock(state, "victim").locked()


@pytest.fixture
async def two_apps(server_backend: Backend) -> AsyncIterator[tuple[State, State]]:
    """Two states on one server with different prefixes (as two applications would have)."""
    namespace = uuid.uuid4().hex
    first = state_from_url(server_backend.url, prefix=f"{TEST_PREFIX}{namespace}:billing:")
    second = state_from_url(server_backend.url, prefix=f"{TEST_PREFIX}{namespace}:chat:")
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()
        await purge_namespace(server_backend, namespace)


class TestPrefixes:
    async def test_locks_of_one_prefix_are_invisible_to_the_other(
        self, two_apps: tuple[State, State]
    ) -> None:
        billing, chat = two_apps
        for key in ("contact:42", "'; DROP TABLE x; --", "{tag}"):
            async with AsyncLock(billing, key, ttl=30.0) as mine:
                assert not await AsyncLock(chat, key).locked()
                assert await chat.inspect(key) is None
                theirs = AsyncLock(chat, key, ttl=30.0)
                assert await theirs.acquire(blocking=False), "the other app's lock blocked"
                assert mine.owned
                await theirs.release()
                assert await AsyncLock(billing, key).locked()

    async def test_dedupe_records_of_one_prefix_are_invisible_to_the_other(
        self, two_apps: tuple[State, State]
    ) -> None:
        billing, chat = two_apps
        assert await Deduper(billing).first_seen("evt-1")
        assert await Deduper(chat).first_seen("evt-1")
        assert not await Deduper(billing).first_seen("evt-1")
        assert await Deduper(chat).forget("evt-1")
        assert not await Deduper(billing).first_seen("evt-1"), "forget crossed the prefixes"

    async def test_admin_listing_shows_only_its_own_prefix(
        self, two_apps: tuple[State, State]
    ) -> None:
        billing, chat = two_apps
        listing = getattr(billing, "held_locks", None)
        if listing is None:
            pytest.skip(f"{type(billing).__name__} has no held_locks()")
        async with AsyncLock(billing, "mine", ttl=30.0), AsyncLock(chat, "theirs", ttl=30.0):
            keys = {info.key async for info in listing()}
        assert "mine" in keys
        assert "theirs" not in keys
        assert not any("chat" in key for key in keys), keys
