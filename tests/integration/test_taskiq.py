"""taskiq tasks with ``asynclock.integrations.taskiq.retry_on_lock_conflict``, in real workers.

``taskiq worker`` and ``taskiq scheduler`` processes (the commands a user runs) over a Redis
stream broker and a Redis schedule source, each test in its own namespace. taskiq's scheduler
works in whole seconds, so the scenes run at the seed's own pace (1 s per second).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest
from taskiq import Context, TaskiqDepends
from taskiq.kicker import AsyncKicker

from asynclock import AsyncLock, RedisState
from asynclock.integrations.taskiq import check_tries, retry_on_lock_conflict
from tests._matrix import REDIS
from tests._storm_workers import RedisConversations
from tests.integration._fleet import (
    CONTACTS,
    MESSAGES,
    Workers,
    events,
    fairness,
    per_customer_outcome,
    storm_outcome,
    until,
)
from tests.integration._job_bodies import PER_CUSTOMER, queue_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from redis.asyncio import Redis
    from taskiq_redis import RedisStreamBroker

pytestmark = [pytest.mark.redis, pytest.mark.processes, pytest.mark.slow]

APP = "tests.integration._taskiq_jobs"
WORKER = (sys.executable, "-m", "taskiq", "worker", f"{APP}:broker", "--workers", "1")
SCHEDULER = (sys.executable, "-m", "taskiq", "scheduler", f"{APP}:scheduler")
SCHEDULER_OPTIONS = ("--update-interval", "1", "--loop-interval", "1")


@pytest.fixture
async def broker(namespace: str) -> AsyncIterator[RedisStreamBroker]:
    """A client of the workers' broker (same stream, same consumer group), to kick tasks."""
    from tests.integration._taskiq_jobs import make_broker

    made = make_broker(namespace, REDIS.url)
    await made.startup()
    yield made
    await made.shutdown()


def _workers(namespace: str, *, unit: float, fair: bool = True, count: int = 1) -> Workers:
    workers = Workers(namespace, unit=unit, fair=fair)
    workers.start(*SCHEDULER, *SCHEDULER_OPTIONS)
    for _ in range(count):
        workers.start(*WORKER)
    return workers


async def _kick(broker: RedisStreamBroker, task: str, *args: int) -> None:
    kicker: AsyncKicker[..., None] = AsyncKicker(task_name=task, broker=broker, labels={})
    await kicker.kiq(*args)


async def test_the_storm_as_taskiq_tasks(
    namespace: str, redis: Redis, broker: RedisStreamBroker
) -> None:
    """20 contacts x 6 first messages at once, 3 workers, waits of 1 s and 2 s against a 3 s
    lock: no duplicate conversation, no lost message, none processed twice."""
    workers = _workers(namespace, unit=1.0, count=3)
    try:
        for message in range(CONTACTS * MESSAGES):
            await _kick(broker, "first_message", message // MESSAGES, message)

        async def all_done() -> bool:
            return (await events(redis, namespace)).count("done") >= CONTACTS * MESSAGES

        await until(all_done, within=60, what="every message processed", workers=workers)
    finally:
        workers.stop()
    print("\n" + (await storm_outcome(redis, namespace)).check("taskiq"))


async def test_a_worker_killed_while_tasks_wait_loses_none(
    namespace: str, redis: Redis, broker: RedisStreamBroker
) -> None:
    """Six tasks meet a held lock and wait in the schedule source; every worker and the
    scheduler are SIGKILLed; new ones, started after the lock is free, run all six."""
    prefix = f"asynclock-test:{namespace}:"
    state = RedisState.from_url(REDIS.url, prefix=prefix)
    holder = AsyncLock(state, "ig:contact:7", ttl=60.0)
    await holder.acquire()
    workers = _workers(namespace, unit=1.0, count=1)
    try:
        for n in range(6):
            await _kick(broker, "first_message", 7, n)

        stream = queue_name("taskiq", namespace)

        async def all_waiting() -> bool:
            # tried, and each delivery acknowledged, which the worker does once the task
            # returned, its retry stored in the schedule source: a kill between the try and
            # that leaves the delivery pending in the stream, where taskiq-redis reclaims it
            # only after its idle_timeout (10 minutes), a task that was running, not waiting
            if len((await events(redis, namespace)).jobs("try")) < 6:
                return False
            return int((await redis.xpending(stream, "workers"))["pending"]) == 0

        await until(all_waiting, within=20, what="six tasks waiting", workers=workers)
        workers.kill()
        await holder.release()
        workers.start(*SCHEDULER, *SCHEDULER_OPTIONS)
        workers.start(*WORKER)

        async def all_done() -> bool:
            return len((await events(redis, namespace)).jobs("done")) == 6

        await until(all_done, within=40, what="every task run after the kill", workers=workers)
    finally:
        workers.stop()
        await state.aclose()
    db = await RedisConversations(redis, prefix).snapshot()
    assert list(db) == [7]
    assert [sorted(ms) for ms in db[7].values()] == [list(range(6))]


@pytest.mark.parametrize("fair", [True, False], ids=["fair", "plain"])
async def test_fairness_against_plain_taskiq_retries(
    namespace: str, redis: Redis, broker: RedisStreamBroker, fair: bool
) -> None:
    """5 tasks meeting the slow holder 0.3 s apart, retrying every 1 s (+ up to 100%)."""
    workers = _workers(namespace, unit=1.0, fair=fair, count=2)

    async def kick() -> None:
        await _kick(broker, "fair_job")

    try:
        inversions, pairs, unfair_exhaustions, log = await fairness(
            redis, namespace, workers, kick, jobs=5, ready=2, apart=0.3, held_after=1.5, within=60
        )
    finally:
        workers.stop()
    name = "fair" if fair else "plain"
    print(
        f"\ntaskiq {name}: {inversions}/{pairs} inversions, {unfair_exhaustions} unfair exhaustions"
    )
    assert pairs == 10, log.entries
    if fair:
        assert inversions == 0, "\n".join(" ".join(e) for e in log.entries)
        assert unfair_exhaustions == 0, log.entries


async def test_n_per_customer_with_a_semaphore(
    namespace: str, redis: Redis, broker: RedisStreamBroker
) -> None:
    """The jobs.md recipe: 6 tasks of one customer, at most 2 at a time; the rest are re-kicked
    through the schedule source (retry_on_lock_conflict, unchanged) until a permit is free."""
    workers = _workers(namespace, unit=1.0, count=2)
    try:
        for _ in range(6):
            await _kick(broker, "per_customer", 7)

        async def all_done() -> bool:
            return len((await events(redis, namespace)).jobs("done")) == 6

        await until(all_done, within=60, what="every task of the customer", workers=workers)
    finally:
        workers.stop()
    most, tries = await per_customer_outcome(redis, namespace, 6)
    assert most <= PER_CUSTOMER
    assert tries > 6  # some met both permits taken and were retried


class TestStartupCheck:
    def test_a_list_schedule_source_with_a_colon_in_its_prefix_is_refused(self) -> None:
        # taskiq-redis splits its time keys on ':' to read a past minute back: under such a
        # prefix a retry due across a minute boundary is never sent (found in this suite)
        from taskiq_redis import ListRedisScheduleSource

        colon = ListRedisScheduleSource(REDIS.url, prefix="app:schedule")
        with pytest.raises(ValueError, match=r"'app:schedule'.*'app-schedule'"):
            retry_on_lock_conflict(wait=1.0, attempts=2, schedule_source=colon)
        plain = ListRedisScheduleSource(REDIS.url, prefix="app-schedule")
        assert callable(retry_on_lock_conflict(wait=1.0, attempts=2, schedule_source=plain))

    def test_too_few_tries_is_a_value_error_naming_both_numbers(self) -> None:
        from taskiq import InMemoryBroker

        broker = InMemoryBroker()

        @broker.task(max_retries=2)
        @retry_on_lock_conflict(wait=1.0, attempts=3)
        async def task(context: Context = TaskiqDepends()) -> None: ...

        with pytest.raises(ValueError, match=r"needs 3 tries .* max_retries=2"):
            check_tries(broker)

    async def test_without_its_context_the_task_says_what_it_needs(self) -> None:
        @retry_on_lock_conflict(wait=1.0, attempts=2)
        async def task() -> None: ...

        with pytest.raises(TypeError, match="TaskiqDepends"):
            await task()
