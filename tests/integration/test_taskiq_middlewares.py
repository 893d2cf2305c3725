"""taskiq's LockMiddleware and UniqueMiddleware in one process, on every backend.

A real taskiq ``InMemoryBroker``: ``kiq`` runs the client-side hooks (``pre_send``,
``post_send``) and its receiver runs the worker-side ones (``pre_execute``, the task,
``on_error``, ``post_execute``) exactly as a ``taskiq worker`` does. The cross-process behaviour
(several ``taskiq worker`` processes, one killed mid-task) is in ``test_taskiq_keyed.py``.
Every wait is on an event the tasks set, bounded.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest
from taskiq import InMemoryBroker, TaskiqMessage
from taskiq.middlewares import SmartRetryMiddleware

from asynclock import LockLostError
from asynclock.integrations.taskiq import (
    LockMiddleware,
    TaskAlreadyQueuedError,
    UniqueMiddleware,
    lock_token,
)
from asynclock.state import LockAdmin

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from asynclock import State

pytestmark = pytest.mark.timeout(60)

BOUND = 20.0


@dataclass
class Record:
    """What the tasks did: per key, who runs now and the most ever at once; starts in order."""

    running: dict[str, int] = field(default_factory=dict)
    most: dict[str, int] = field(default_factory=dict)
    started: list[tuple[str, int, int | None]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def enter(self, key: str, n: int) -> None:
        self.running[key] = self.running.get(key, 0) + 1
        self.most[key] = max(self.most.get(key, 0), self.running[key])
        self.started.append((key, n, lock_token()))
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds, checked after each start; bounded."""

        async def waiting() -> None:
            while not condition():
                await self._changed.wait()

        await asyncio.wait_for(waiting(), BOUND)

    def leave(self, key: str) -> None:
        self.running[key] -= 1

    def order(self, key: str) -> list[int]:
        return [n for k, n, _ in self.started if k == key]

    def tokens(self, key: str) -> list[int | None]:
        return [t for k, _, t in self.started if k == key]


@pytest.fixture
async def broker(state: State) -> AsyncIterator[InMemoryBroker]:
    made = InMemoryBroker()
    await made.startup()
    yield made
    await asyncio.wait_for(made.wait_all(), BOUND)
    await made.shutdown()


async def settled(broker: InMemoryBroker) -> None:
    await asyncio.wait_for(broker.wait_all(), BOUND)


class TestLockMiddleware:
    async def test_one_key_runs_one_task_at_a_time_in_kick_order_and_other_keys_meanwhile(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        broker.add_middlewares(LockMiddleware(state, ttl=5.0))
        record = Record()

        @broker.task(task_name="keyed", lock_key="contact:{contact}")
        async def keyed(contact: str, n: int) -> None:
            record.enter(contact, n)
            try:
                if contact == "a" and n == 0:
                    await record.gate.wait()  # the first of "a" holds its key until told
                else:
                    await asyncio.sleep(0.01)
            finally:
                record.leave(contact)

        for n in range(5):
            await keyed.kiq("a", n)
        await record.wait_for(lambda: bool(record.started))
        await keyed.kiq("b", 0)
        # "b" is not held up by the busy "a": it runs while "a"'s first task holds its key
        await record.wait_for(lambda: record.order("b") == [0])
        assert record.order("a") == [0]
        record.gate.set()
        await settled(broker)
        assert record.order("a") == [0, 1, 2, 3, 4]
        assert record.most == {"a": 1, "b": 1}
        tokens = [t for t in record.tokens("a") if t is not None]
        assert len(tokens) == 5
        assert tokens == sorted(set(tokens))  # fenced: strictly increasing
        assert await state.inspect("taskiq:contact:a") is None  # released after the last

    async def test_the_key_is_released_on_every_outcome(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        broker.add_middlewares(LockMiddleware(state, ttl=5.0))

        @broker.task(task_name="fails", lock_key="k")
        async def fails() -> None:
            raise RuntimeError("boom")

        @broker.task(task_name="slow", lock_key="k", timeout=0.05)
        async def slow() -> None:
            await asyncio.sleep(10)

        @broker.task(task_name="fine", lock_key="k")
        async def fine() -> int | None:
            return lock_token()

        failed = await fails.kiq()
        timed_out = await slow.kiq()
        done = await fine.kiq()
        await settled(broker)
        assert (await failed.wait_result(timeout=BOUND)).is_err
        assert (await timed_out.wait_result(timeout=BOUND)).is_err
        result = await done.wait_result(timeout=BOUND)
        assert not result.is_err
        assert isinstance(result.return_value, int)
        assert await state.inspect("taskiq:k") is None
        assert lock_token() is None  # nothing leaks into the caller's context

    async def test_a_key_given_at_kiq_time_and_a_task_without_one(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        broker.add_middlewares(LockMiddleware(state, ttl=5.0, prefix="p:"))
        seen: list[tuple[str, int | None]] = []

        @broker.task(task_name="plain")
        async def plain(name: str) -> None:
            seen.append((name, lock_token()))
            if name == "keyed":
                assert await state.inspect("p:invoice:7") is not None

        await plain.kiq("free")
        await plain.kicker().with_labels(lock_key="invoice:7").kiq("keyed")
        await settled(broker)
        assert sorted(n for n, _ in seen) == ["free", "keyed"]
        assert dict(seen)["free"] is None
        assert dict(seen)["keyed"] is not None

    async def test_a_lost_lock_cancels_the_task_and_is_its_result(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        if not isinstance(state, LockAdmin):
            pytest.fail(f"{type(state).__name__} has no force_release")
        broker.add_middlewares(LockMiddleware(state, ttl=0.6))
        running = asyncio.Event()
        cancelled = asyncio.Event()

        @broker.task(task_name="long", lock_key="k")
        async def long() -> None:
            running.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        task = await long.kiq()
        await asyncio.wait_for(running.wait(), BOUND)
        await state.force_release("taskiq:k")  # an operator's unlock: its next renewal fails
        await asyncio.wait_for(cancelled.wait(), BOUND)
        result = await task.wait_result(timeout=BOUND)
        assert result.is_err
        assert isinstance(result.error, LockLostError)

    def test_bad_arguments_are_named(self, state: State) -> None:
        with pytest.raises(ValueError, match="ttl"):
            LockMiddleware(state, ttl=0)
        with pytest.raises(ValueError, match="timeout"):
            LockMiddleware(state, timeout=-1)
        with pytest.raises(ValueError, match="label"):
            LockMiddleware(state, label="")

    async def test_a_template_naming_a_missing_argument_is_a_clear_error(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        broker.add_middlewares(UniqueMiddleware(state))

        @broker.task(task_name="typo", unique_key="report:{dya}")
        async def typo(day: str) -> None: ...

        with pytest.raises(ValueError, match=r"'dya'.*\(its arguments: day\)"):
            await typo.kiq("2024-05-01")


class TestUniqueMiddleware:
    async def test_a_second_kiq_is_refused_while_the_first_is_pending_or_running(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        unique = UniqueMiddleware(state, ttl=5.0)
        broker.add_middlewares(unique)
        record = Record()

        @broker.task(task_name="report", unique_key="report:{day}")
        async def report(day: str) -> str:
            record.enter(day, 0)
            await record.gate.wait()
            return day

        first = await report.kiq("monday")
        other = await report.kiq("tuesday")  # another key: sent
        with pytest.raises(TaskAlreadyQueuedError) as refused:
            await report.kiq("monday")  # pending (or just started)
        assert refused.value.key == "report:monday"
        assert refused.value.task_id == first.task_id
        assert refused.value.retry_after is not None
        assert 0 < refused.value.retry_after <= 5.0
        await record.wait_for(lambda: len(record.started) == 2)
        with pytest.raises(TaskAlreadyQueuedError):
            await report.kiq("monday")  # running
        assert unique.refused == 2
        record.gate.set()
        assert (await first.wait_result(timeout=BOUND)).return_value == "monday"
        assert (await other.wait_result(timeout=BOUND)).return_value == "tuesday"
        again = await report.kiq("monday")  # done: the key is free again
        assert (await again.wait_result(timeout=BOUND)).return_value == "monday"
        await settled(broker)
        assert await state.inspect("taskiq-unique:report:monday") is None

    async def test_a_failed_task_frees_its_key_and_a_retried_one_keeps_it(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        broker.add_middlewares(
            SmartRetryMiddleware(default_retry_count=2, default_delay=0.0, use_jitter=False),
            UniqueMiddleware(state, ttl=5.0),
        )
        tries: list[int] = []
        retried = asyncio.Event()
        release = asyncio.Event()

        @broker.task(task_name="flaky", unique_key="flaky", retry_on_error=True, max_retries=2)
        async def flaky() -> None:
            tries.append(len(tries) + 1)
            if len(tries) == 1:
                raise RuntimeError("first try fails")
            retried.set()
            await release.wait()

        first = await flaky.kiq()
        await asyncio.wait_for(retried.wait(), BOUND)
        # the retry (same task id) runs: the key stayed with the task across its re-kick
        with pytest.raises(TaskAlreadyQueuedError) as refused:
            await flaky.kiq()
        assert refused.value.task_id == first.task_id
        release.set()
        await settled(broker)
        assert tries == [1, 2]

        @broker.task(task_name="broken", unique_key="broken")
        async def broken() -> None:
            raise RuntimeError("always")

        await broken.kiq()
        await settled(broker)
        assert await state.inspect("taskiq-unique:broken") is None
        await broken.kiq()  # not refused: the failure freed it
        await settled(broker)

    async def test_a_reservation_lapses_after_its_ttl(
        self, state: State, broker: InMemoryBroker
    ) -> None:
        # a client whose broker never delivers (the worker side is not this broker): the
        # reservation of the pending task lapses after ttl, then the key is free
        unique = UniqueMiddleware(state, ttl=0.3)
        unique.set_broker(broker)

        @broker.task(task_name="lonely", unique_key="k")
        async def lonely() -> None: ...

        message = TaskiqMessage(
            task_id="t-1", task_name="lonely", labels={"unique_key": "k"}, args=[], kwargs={}
        )
        await unique.pre_send(message)
        await unique.post_send(message)
        assert await state.inspect("taskiq-unique:k") is not None
        deadline = asyncio.get_running_loop().time() + BOUND
        while await state.inspect("taskiq-unique:k") is not None:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
