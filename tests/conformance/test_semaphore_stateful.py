"""Model-based test of ``Semaphore``: random tries, releases, extends and expiries (issue #29).

The pattern of ``test_stateful.py`` (its :class:`LoopRunner` and :class:`Actor`): a Hypothesis
``RuleBasedStateMachine`` drives a backend and a set model side by side, and after every step
checks that the backend's holders are the model's, never more than ``LIMIT``, and that tokens
only grow. Expiry: memory moves an injected clock; servers shorten the permit to 1 ms and wait
until the server dropped it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import TYPE_CHECKING, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from asynclock import LockNotOwnedError, MemoryState, Semaphore, state_from_url
from asynclock.state import SemaphoreState
from tests._helpers import FakeClock
from tests._matrix import purge_namespace
from tests.conformance.test_stateful import Actor, LoopRunner

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from asynclock import State
    from tests._matrix import Backend

T = TypeVar("T")

OWNERS = 4
LIMIT = 2
KEY = "permits"
TTL = 60.0

owners = st.integers(0, OWNERS - 1)


class SemaphoreMachine(RuleBasedStateMachine):
    #: set on the per-backend subclass that the test builds
    backend: ClassVar[Backend]

    def __init__(self) -> None:
        super().__init__()
        self.namespace = uuid.uuid4().hex
        self.clock = None if self.backend.server else FakeClock()
        self.runner = LoopRunner()
        self.state: State = self.runner.run(self._open())
        assert isinstance(self.state, SemaphoreState)
        self.permits: SemaphoreState = self.state
        self.objects = [Semaphore(self.state, KEY, limit=LIMIT, ttl=TTL) for _ in range(OWNERS)]
        self.actors = self.runner.run(self._start_actors())
        # the model: who holds a permit, and the largest token seen
        self.holders: set[int] = set()
        self.last_token = 0

    async def _open(self) -> State:
        if self.clock is not None:
            return MemoryState(clock=self.clock)
        return state_from_url(self.backend.url, **self.backend.options(self.namespace))

    async def _start_actors(self) -> list[Actor]:
        return [Actor() for _ in range(OWNERS)]

    async def _close(self) -> None:
        for actor in self.actors:
            actor.task.cancel()
        for actor in self.actors:
            with contextlib.suppress(asyncio.CancelledError):
                await actor.task
        await self.state.aclose()
        await purge_namespace(self.backend, self.namespace)

    def teardown(self) -> None:
        try:
            self.runner.run(self._close())
        finally:
            self.runner.close()

    def as_owner(self, owner: int, call: Callable[[], Awaitable[T]]) -> T:
        return self.runner.run(self.actors[owner].run(call))

    @rule(owner=owners)
    def acquire(self, owner: int) -> None:
        permit = self.objects[owner]
        if permit.owned:
            return
        got = self.as_owner(owner, lambda: permit.acquire(blocking=False))
        assert got is (len(self.holders) < LIMIT)
        if got:
            assert permit.token is not None
            assert permit.token > self.last_token
            self.last_token = permit.token
            self.holders.add(owner)
        else:
            assert permit.retry_after is not None

    @rule(owner=owners)
    def release(self, owner: int) -> None:
        permit = self.objects[owner]
        if not permit.owned:
            return
        if owner in self.holders:
            self.as_owner(owner, permit.release)
            self.holders.discard(owner)
        else:
            with pytest.raises(LockNotOwnedError):
                self.as_owner(owner, permit.release)

    @rule(owner=owners)
    def extend(self, owner: int) -> None:
        permit = self.objects[owner]
        if not permit.owned:
            return
        if owner in self.holders:
            self.as_owner(owner, permit.extend)
        else:
            with pytest.raises(LockNotOwnedError):
                self.as_owner(owner, permit.extend)

    @rule(owner=owners)
    def expire(self, owner: int) -> None:
        if owner not in self.holders:
            return
        permit = self.objects[owner]
        self.as_owner(owner, lambda: permit.extend(0.001))
        if self.clock is not None:
            self.clock.advance(0.01)
        else:
            self.runner.run(self._until_gone(permit.owner))
        self.holders.discard(owner)

    async def _until_gone(self, holder: str) -> None:
        deadline = time.monotonic() + 5.0
        while holder in {h.owner for h in (await self.permits.semaphore_inspect(KEY)).holders}:
            assert time.monotonic() < deadline, f"the permit of {holder} did not expire"
            await asyncio.sleep(0.002)

    @invariant()
    def holders_match_the_model(self) -> None:
        info = self.runner.run(self.permits.semaphore_inspect(KEY))
        assert len(info.holders) <= LIMIT
        assert {h.owner for h in info.holders} == {self.objects[o].owner for o in self.holders}
        for held in info.holders:
            assert 0 < held.remaining <= TTL
        assert info.waiting == 0  # tries never keep a place


def test_semaphore_state_machine(backend: Backend) -> None:
    machine = type(f"SemaphoreMachine_{backend.name}", (SemaphoreMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
