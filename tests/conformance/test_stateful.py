"""Model-based test: random sequences of lock and dedupe operations against a dict model.

A Hypothesis ``RuleBasedStateMachine`` drives a backend and a tiny model side by side and checks,
after every step, that the backend's holders match the model's and that fencing tokens only grow.
Each machine runs its own event loop (what ``asyncio.Runner`` does, written out so it also works
on Python 3.10) and a fresh namespace. Every lock is used from one long-lived task per owner,
because an ``AsyncLock`` belongs to the task that acquired it.

Expiry: on memory an injected clock is moved forward; on servers the holder shortens its TTL to
one millisecond and the machine waits until the server dropped the key.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from asynclock import AsyncLock, Deduper, LockNotOwnedError, MemoryState, state_from_url
from tests._helpers import FakeClock, owned, token_of
from tests._matrix import purge_namespace

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine

    from asynclock import State
    from tests._matrix import Backend

T = TypeVar("T")

OWNERS = 3
KEYS = ("key-0", "key-1")
LOCK_TTL = 60.0
DEDUPE_TTL = 600.0

owners = st.integers(0, OWNERS - 1)
keys = st.integers(0, len(KEYS) - 1)
event_ids = st.sampled_from(["a", "b", "c"])


class LoopRunner:
    """One event loop for the whole life of a machine (like ``asyncio.Runner``)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        try:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()


class Actor:
    """A long-lived task that runs the calls of one owner, so each lock has one owning task."""

    def __init__(self) -> None:
        self._calls: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], asyncio.Future[Any]]]
        self._calls = asyncio.Queue()
        self.task = asyncio.create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            call, done = await self._calls.get()
            try:
                result = await call()
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)
            else:
                done.set_result(result)

    async def run(self, call: Callable[[], Awaitable[T]]) -> T:
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._calls.put_nowait((call, done))
        return await done


class LockMachine(RuleBasedStateMachine):
    #: set on the per-backend subclass that the test builds
    backend: ClassVar[Backend]

    def __init__(self) -> None:
        super().__init__()
        self.namespace = uuid.uuid4().hex
        self.clock = None if self.backend.server else FakeClock()
        self.runner = LoopRunner()
        self.state: State = self.runner.run(self._open())
        self.locks = [[AsyncLock(self.state, key, ttl=LOCK_TTL) for key in KEYS] for _ in range(3)]
        self.dedupe = Deduper(self.state, ttl=DEDUPE_TTL, namespace="model")
        self.actors = self.runner.run(self._start_actors())
        # The model.
        self.holder: list[int | None] = [None] * len(KEYS)
        self.last_token: list[int | None] = [None] * len(KEYS)
        self.seen: set[str] = set()

    async def _open(self) -> State:
        if self.clock is not None:
            return MemoryState(clock=self.clock)
        return state_from_url(self.backend.url, **self.backend.options(self.namespace))

    async def _start_actors(self) -> list[Actor]:
        return [Actor() for _ in range(OWNERS)]

    async def _close(self) -> None:
        for actor in self.actors:
            actor.task.cancel()
        await asyncio.gather(*(actor.task for actor in self.actors), return_exceptions=True)
        await self.state.aclose()
        await purge_namespace(self.backend, self.namespace)

    def teardown(self) -> None:
        try:
            self.runner.run(self._close())
        finally:
            self.runner.close()

    def as_owner(self, owner: int, call: Callable[[], Awaitable[T]]) -> T:
        return self.runner.run(self.actors[owner].run(call))

    @rule(owner=owners, k=keys)
    def acquire(self, owner: int, k: int) -> None:
        lock = self.locks[owner][k]
        if lock.owned:  # re-entering one object is misuse, tested elsewhere
            return
        got = self.as_owner(owner, lambda: lock.acquire(blocking=False))
        assert got is (self.holder[k] is None)
        assert owned(lock) is got
        if got:
            last, token = self.last_token[k], token_of(lock)
            assert last is None or token > last, (last, token)
            self.last_token[k] = token
            self.holder[k] = owner

    @rule(owner=owners, k=keys)
    def release(self, owner: int, k: int) -> None:
        lock = self.locks[owner][k]
        if not lock.owned:
            return
        if self.holder[k] == owner:
            self.as_owner(owner, lock.release)
            self.holder[k] = None
        else:
            with pytest.raises(LockNotOwnedError):
                self.as_owner(owner, lock.release)
        assert not owned(lock)

    @rule(owner=owners, k=keys)
    def extend(self, owner: int, k: int) -> None:
        lock = self.locks[owner][k]
        if not lock.owned:
            return
        if self.holder[k] == owner:
            self.as_owner(owner, lock.extend)
        else:
            with pytest.raises(LockNotOwnedError):
                self.as_owner(owner, lock.extend)

    @rule(k=keys)
    def expire(self, k: int) -> None:
        owner = self.holder[k]
        if owner is None:
            return
        lock = self.locks[owner][k]
        self.as_owner(owner, lambda: lock.extend(0.001))
        if self.clock is not None:
            self.clock.advance(0.01)
        else:
            self.runner.run(self._until_gone(KEYS[k]))
        self.holder[k] = None

    async def _until_gone(self, key: str) -> None:
        deadline = time.monotonic() + 5.0
        while await self.state.inspect(key) is not None:
            assert time.monotonic() < deadline, f"{key} did not expire"
            await asyncio.sleep(0.002)

    @precondition(lambda self: self.clock is not None)
    @rule()
    def advance_past_every_ttl(self) -> None:
        assert self.clock is not None
        self.clock.advance(DEDUPE_TTL + 1.0)
        self.holder = [None] * len(KEYS)
        self.seen.clear()

    @rule(event_id=event_ids)
    def first_seen(self, event_id: str) -> None:
        fresh = self.runner.run(self.dedupe.first_seen(event_id))
        assert fresh is (event_id not in self.seen)
        self.seen.add(event_id)

    @rule(event_id=event_ids)
    def forget(self, event_id: str) -> None:
        self.runner.run(self.dedupe.forget(event_id))
        self.seen.discard(event_id)

    @invariant()
    def holders_match_the_model(self) -> None:
        for k, key in enumerate(KEYS):
            info = self.runner.run(self.state.inspect(key))
            owner = self.holder[k]
            if owner is None:
                assert info is None, (key, info)
            else:
                lock = self.locks[owner][k]
                assert info is not None, (key, "model has a holder, backend has none")
                assert (info.owner, info.token) == (lock.owner, lock.token)
                assert 0 < info.remaining <= LOCK_TTL


def test_lock_and_dedupe_state_machine(backend: Backend) -> None:
    machine = type(f"LockMachine_{backend.name}", (LockMachine,), {"backend": backend})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=50,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
