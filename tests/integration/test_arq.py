"""arq jobs with ``asynclock.integrations.arq.retry_on_lock_conflict``, in real arq workers.

Workers are started as a user starts them (``python -m arq module.WorkerSettings``) on the real
Redis, each test in its own namespace (queue, job ids, keys). The scenes are in
``_job_bodies.py``: the seed's storm of first messages, a worker killed while jobs wait for their
retry, and the fairness measurement against arq's plain retry.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import pytest
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import func

from asynclock import AsyncLock, RedisState
from asynclock.integrations.arq import check_tries, retry_on_lock_conflict
from tests._helpers import reply
from tests._matrix import REDIS
from tests._storm_workers import RedisConversations
from tests.integration._fleet import (
    CONTACTS,
    MESSAGES,
    Log,
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

    from arq.connections import ArqRedis
    from redis.asyncio import Redis

pytestmark = [pytest.mark.redis, pytest.mark.processes, pytest.mark.slow]

WORKER = (sys.executable, "-m", "arq", "tests.integration._arq_jobs.WorkerSettings")


@pytest.fixture
async def arq_pool(namespace: str) -> AsyncIterator[ArqRedis]:
    pool = await create_pool(
        RedisSettings.from_dsn(REDIS.url), default_queue_name=queue_name("arq", namespace)
    )
    yield pool
    await pool.aclose()


def _workers(namespace: str, *, unit: float, fair: bool = True, count: int = 1) -> Workers:
    workers = Workers(namespace, unit=unit, fair=fair)
    for _ in range(count):
        workers.start(*WORKER)
    return workers


async def test_the_storm_as_arq_jobs(namespace: str, redis: Redis, arq_pool: ArqRedis) -> None:
    """20 contacts x 6 first messages at once, 3 workers, the Instagram tuning scaled to 0.2 s
    per second: no duplicate conversation, no lost message, none processed twice."""
    workers = _workers(namespace, unit=0.2, count=3)
    try:
        for message in range(CONTACTS * MESSAGES):
            await arq_pool.enqueue_job(
                "first_message", message // MESSAGES, message, _job_id=f"{namespace}-m{message}"
            )

        async def all_done() -> bool:
            return (await events(redis, namespace)).count("done") >= CONTACTS * MESSAGES

        await until(all_done, within=60, what="every message processed", workers=workers)
        queue = queue_name("arq", namespace)
        await until(
            lambda: _empty(redis, queue), within=10, what="arq queue drained", workers=workers
        )
    finally:
        workers.stop()
    print("\n" + (await storm_outcome(redis, namespace)).check("arq"))


async def _empty(redis: Redis, queue: str) -> bool:
    return int(await reply(redis.zcard(queue))) == 0


async def test_a_worker_killed_while_jobs_wait_loses_none(
    namespace: str, redis: Redis, arq_pool: ArqRedis
) -> None:
    """Six jobs meet a held lock and are deferred; every worker is SIGKILLed during the wait; a
    new worker, started after the lock is free, runs all six."""
    prefix = f"asynclock-test:{namespace}:"
    state = RedisState.from_url(REDIS.url, prefix=prefix)
    holder = AsyncLock(state, "ig:contact:7", ttl=30.0)
    await holder.acquire()
    workers = _workers(namespace, unit=0.5, count=2)
    jobs = [f"{namespace}-k{n}" for n in range(6)]
    try:
        for n, job in enumerate(jobs):
            await arq_pool.enqueue_job("first_message", 7, n, _job_id=job)

        async def all_deferred() -> bool:
            log = await events(redis, namespace)
            if set(log.jobs("try")) != set(jobs):
                return False
            running = [await reply(redis.exists(f"arq:in-progress:{job}")) for job in jobs]
            return not any(running)

        await until(all_deferred, within=20, what="six jobs deferred", workers=workers)
        workers.kill()
        await holder.release()
        workers.start(*WORKER)

        async def all_done() -> bool:
            return set((await events(redis, namespace)).jobs("done")) == set(jobs)

        await until(all_done, within=30, what="every job run after the kill", workers=workers)
    finally:
        workers.stop()
        await state.aclose()
    db = await RedisConversations(redis, prefix).snapshot()
    assert list(db) == [7]
    assert [sorted(ms) for ms in db[7].values()] == [list(range(6))]


async def _fairness(
    namespace: str, redis: Redis, arq_pool: ArqRedis, *, fair: bool
) -> tuple[int, int, int, Log]:
    """8 jobs meeting the slow holder 40 ms apart, retrying every 0.1 s (+ up to 100%)."""
    workers = _workers(namespace, unit=0.1, fair=fair, count=2)
    jobs = iter(range(8))

    async def kick() -> None:
        await arq_pool.enqueue_job("fair_job", _job_id=f"{namespace}-f{next(jobs)}")

    try:
        return await fairness(
            redis, namespace, workers, kick, jobs=8, ready=2, apart=0.04, held_after=0.3, within=60
        )
    finally:
        workers.stop()


async def test_fair_retries_serve_jobs_in_first_conflict_order(
    namespace: str, redis: Redis, arq_pool: ArqRedis
) -> None:
    inversions, pairs, unfair_exhaustions, log = await _fairness(
        namespace, redis, arq_pool, fair=True
    )
    assert pairs == 28, log.entries
    print(f"\narq fair: {inversions}/{pairs} inversions, {unfair_exhaustions} unfair exhaustions")
    assert inversions == 0, log.entries
    assert unfair_exhaustions == 0, log.entries


async def test_plain_arq_retries_are_the_baseline(
    namespace: str, redis: Redis, arq_pool: ArqRedis
) -> None:
    """The same scene with ``fair=False``: arq's plain deferred retry serves whoever comes back
    first after a release (the seed: "ActiveJob retries are not FIFO")."""
    inversions, pairs, unfair_exhaustions, log = await _fairness(
        namespace, redis, arq_pool, fair=False
    )
    print(f"\narq plain: {inversions}/{pairs} inversions, {unfair_exhaustions} unfair exhaustions")
    assert pairs == 28, log.entries
    assert inversions > 0, "the measurement could not tell fair from plain retries"


async def test_n_per_customer_with_a_semaphore(
    namespace: str, redis: Redis, arq_pool: ArqRedis
) -> None:
    """The jobs.md recipe: 8 jobs of one customer on 2 workers, at most 2 at a time; the rest
    go back to the queue (retry_on_lock_conflict, unchanged) until a permit is free."""
    workers = _workers(namespace, unit=0.2, count=2)
    try:
        for n in range(8):
            await arq_pool.enqueue_job("per_customer", 7, _job_id=f"{namespace}-c{n}")

        async def all_done() -> bool:
            return len((await events(redis, namespace)).jobs("done")) == 8

        await until(all_done, within=60, what="every job of the customer", workers=workers)
    finally:
        workers.stop()
    most, tries = await per_customer_outcome(redis, namespace, 8)
    assert most <= PER_CUSTOMER
    assert tries > 8  # some met both permits taken and were retried


class TestStartupCheck:
    def test_too_few_tries_is_a_value_error_naming_both_numbers(self) -> None:
        @retry_on_lock_conflict(wait=1.0, attempts=4)
        async def job(ctx: dict[str, Any]) -> None: ...

        with pytest.raises(ValueError, match=r"needs 4 tries .* max_tries=3 \(arq\.func"):
            check_tries({"functions": [func(job, max_tries=3)]})
        with pytest.raises(ValueError, match=r"needs 4 tries .* max_tries=2 \(the settings"):
            check_tries({"functions": [job], "max_tries": 2})
        with pytest.raises(ValueError, match="retry_jobs is False"):
            check_tries({"functions": [job], "retry_jobs": False})
        settings = {"functions": [job]}  # arq's default max_tries is 5
        assert check_tries(settings) is settings

    async def test_outside_arq_the_job_says_what_it_needs(self) -> None:
        @retry_on_lock_conflict(wait=1.0, attempts=2)
        async def job(ctx: dict[str, Any]) -> None: ...

        with pytest.raises(TypeError, match="arq's ctx"):
            await job({})
