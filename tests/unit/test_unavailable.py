"""An unreachable or silent server raises ``StateUnavailableError`` in time, never hangs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from asynclock import (
    AsyncLock,
    AsynclockError,
    Deduper,
    RedisState,
    StateError,
    StateUnavailableError,
    state_from_url,
)
from tests.support.ports import bound_socket, port_of

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from asynclock import State

TIMEOUT = 0.5
#: "Within the timeout" with room for a loaded machine: twice connect + operation timeouts.
BOUND = 2 * (TIMEOUT + TIMEOUT)
SECRET = "s3cr3t-Pa55"

OPERATIONS: dict[str, Callable[[State], Awaitable[object]]] = {
    "acquire": lambda s: AsyncLock(s, "k", ttl=5.0).acquire(),
    "acquire-nonblocking": lambda s: AsyncLock(s, "k", ttl=5.0).acquire(blocking=False),
    "acquire-timeout": lambda s: AsyncLock(s, "k", ttl=5.0).acquire(timeout=30.0),
    "locked": lambda s: AsyncLock(s, "k").locked(),
    "first_seen": lambda s: Deduper(s).first_seen("evt"),
    "forget": lambda s: Deduper(s).forget("evt"),
    "inspect": lambda s: s.inspect("k"),
}


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections (in the kernel backlog) and never answers."""
    with bound_socket() as sock:
        sock.listen(64)
        yield port_of(sock)


async def assert_unavailable_in_time(
    state: State, operation: Callable[[State], Awaitable[object]]
) -> StateUnavailableError:
    start = time.monotonic()
    with pytest.raises(StateUnavailableError) as caught:
        await operation(state)
    elapsed = time.monotonic() - start
    assert elapsed < BOUND, f"took {elapsed:.2f} s with {TIMEOUT} s timeouts"
    error = caught.value
    assert isinstance(error, StateError)
    assert isinstance(error, AsynclockError)
    assert isinstance(error, ConnectionError)
    assert error.__cause__ is not None, "the driver's error is chained"
    return error


class TestRefusedConnection:
    @pytest.mark.parametrize("operation", list(OPERATIONS.values()), ids=list(OPERATIONS))
    async def test_raises_state_unavailable_in_time(
        self, operation: Callable[[State], Awaitable[object]]
    ) -> None:
        state = RedisState.from_url(
            "redis://127.0.0.1:1/0", connect_timeout=TIMEOUT, op_timeout=TIMEOUT
        )
        try:
            await assert_unavailable_in_time(state, operation)
        finally:
            await state.aclose()

    async def test_async_with_raises_state_unavailable_not_acquisition_error(self) -> None:
        state = state_from_url("redis://127.0.0.1:1/0", connect_timeout=TIMEOUT, op_timeout=TIMEOUT)
        try:
            start = time.monotonic()
            with pytest.raises(StateUnavailableError):
                async with AsyncLock(state, "k"):
                    pass
            assert time.monotonic() - start < BOUND
        finally:
            await state.aclose()

    async def test_error_message_does_not_show_the_password(self) -> None:
        state = RedisState.from_url(
            f"redis://user:{SECRET}@127.0.0.1:1/0", connect_timeout=TIMEOUT, op_timeout=TIMEOUT
        )
        try:
            error = await assert_unavailable_in_time(state, OPERATIONS["acquire"])
            assert SECRET not in str(error)
            assert SECRET not in repr(error)
        finally:
            await state.aclose()


class TestSilentServer:
    @pytest.mark.parametrize(
        "operation",
        [OPERATIONS["acquire"], OPERATIONS["first_seen"], OPERATIONS["locked"]],
        ids=["acquire", "first_seen", "locked"],
    )
    async def test_raises_state_unavailable_in_time(
        self, silent_port: int, operation: Callable[[State], Awaitable[object]]
    ) -> None:
        state = RedisState.from_url(
            f"redis://127.0.0.1:{silent_port}/0", connect_timeout=TIMEOUT, op_timeout=TIMEOUT
        )
        try:
            await assert_unavailable_in_time(state, operation)
        finally:
            start = time.monotonic()
            await state.aclose()
            assert time.monotonic() - start < BOUND, "aclose hung on a silent server"
