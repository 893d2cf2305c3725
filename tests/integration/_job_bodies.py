"""The job bodies the arq and taskiq workers of ``test_arq.py`` / ``test_taskiq.py`` run.

Framework-free: each framework's worker module (``_arq_jobs.py``, ``_taskiq_jobs.py``) wraps these
in its own ``retry_on_lock_conflict`` and passes its per-process :class:`Scene`. Configured by
environment variables, because the workers are started as a user starts them (the framework's
command line), not by the test:

* ``JOBS_NAMESPACE``: the test's namespace (keys, queue names, job ids);
* ``JOBS_UNIT``: the seed's second, scaled down (``wait=lambda n: n * unit``, TTL ``3 * unit``);
* ``JOBS_FAIR``: ``"1"`` for fair retries, ``"0"`` for the framework's plain retry (baseline);
* ``JOBS_REDIS_URL``: the Redis server (locks, the conversations "database", the event log).

Every job appends to one event log (a Redis list, so all processes share one total order):
``try <job> <n>`` at the start of each try, ``conflict <job> <n>`` after a refusal (fairness
scene), ``locked <job>`` once it holds the lock,
``granted <job>`` when it runs without it (``process_without_lock``), ``done <job>``,
``exhausted <job>`` (an ``on_exhaustion`` callable), ``inside <job> <n>`` (the per-customer
scene: how many jobs of the customer held a permit once this one entered).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from redis.asyncio import Redis

from asynclock import AsyncLock, LockAcquisitionError, RedisState, Semaphore
from tests._helpers import reply
from tests._storm_workers import RedisConversations

NAMESPACE = os.environ.get("JOBS_NAMESPACE", "unset")
UNIT = float(os.environ.get("JOBS_UNIT", "0.2"))
FAIR = os.environ.get("JOBS_FAIR", "1") == "1"
REDIS_URL = os.environ.get("JOBS_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = f"asynclock-test:{NAMESPACE}:"
#: the seed's lock TTL (3 s), scaled: the retry window 1 + 2 units covers it exactly
LOCK_TTL = 3 * UNIT
#: the fairness scene: conflicting jobs retry every unit (+ up to 100% jitter) and hold a while
FAIR_HOLD = 0.5 * UNIT
FAIR_ATTEMPTS = 60
#: the per-customer scene: at most this many jobs of one customer at a time (a Semaphore)
PER_CUSTOMER = 2


def log_key(namespace: str | None = None) -> str:
    return f"asynclock-test:{namespace or NAMESPACE}:log"


def queue_name(framework: str, namespace: str | None = None) -> str:
    return f"asynclock-test:{namespace or NAMESPACE}:{framework}"


@dataclass
class Scene:
    """One worker process's clients: the lock state, the conversations, the event log."""

    state: RedisState
    db: RedisConversations
    redis: Redis

    @classmethod
    def open(cls) -> Scene:
        redis = Redis.from_url(REDIS_URL)
        return cls(
            RedisState.from_url(REDIS_URL, prefix=PREFIX), RedisConversations(redis, PREFIX), redis
        )

    async def warm(self) -> None:
        """Connect and load the fair scripts now, so a worker's first job is as fast as the
        next (the fairness scene kicks jobs a fraction of a second apart)."""
        await self.state.fair_leave("hot", "warm-up")
        await self.state.inspect("hot")
        await reply(self.redis.ping())
        await self.log("ready", os.getpid())

    async def close(self) -> None:
        await self.state.aclose()
        await self.redis.aclose()

    async def log(self, *words: object) -> None:
        await reply(self.redis.rpush(log_key(), " ".join(str(w) for w in words)))


async def first_message(scene: Scene, job: str, contact: int, message: int, job_try: int) -> None:
    """The seed's Instagram job: find the contact's conversation or create it, then append."""
    await scene.log("try", job, job_try)
    async with AsyncLock(
        scene.state, f"ig:contact:{contact}", ttl=LOCK_TTL, blocking=False
    ) as lock:
        await scene.log("granted" if lock.granted else "locked", job)
        conversation = await scene.db.find_active(contact)
        await asyncio.sleep(0.005)  # the rest of the builder's work between its find and create
        if conversation is None:
            conversation = await scene.db.create(contact)
        await scene.db.append(conversation, message)
    await scene.log("done", job)


async def fair_job(scene: Scene, job: str, job_try: int) -> None:
    """One of the fairness scene's jobs on one hot key: holds it for ``FAIR_HOLD`` seconds."""
    await scene.log("try", job, job_try)
    try:
        async with AsyncLock(scene.state, "hot", ttl=30.0, blocking=False):
            await scene.log("locked", job)
            await asyncio.sleep(FAIR_HOLD)
    except LockAcquisitionError:
        # right after the refusal that took (or kept) the job's place: the order of the first
        # of these is the first-conflict order (a "try" entry is one job start earlier, and a
        # busy worker can be slower than the next job between the two)
        await scene.log("conflict", job, job_try)
        raise
    await scene.log("done", job)


async def exhausted(scene: Scene, job: str) -> None:
    await scene.log("exhausted", job)


async def per_customer(scene: Scene, job: str, customer: int, job_try: int) -> None:
    """The "N per customer" recipe (docs/jobs.md): at most ``PER_CUSTOMER`` jobs of one customer
    run at once, across every worker; a job that finds them all busy is retried later."""
    await scene.log("try", job, job_try)
    counter = f"{PREFIX}customer:{customer}:inside"
    async with Semaphore(
        scene.state, f"customer:{customer}", limit=PER_CUSTOMER, ttl=LOCK_TTL, blocking=False
    ):
        inside = await reply(scene.redis.incr(counter))
        await scene.log("inside", job, inside)
        await asyncio.sleep(FAIR_HOLD)
        await reply(scene.redis.decr(counter))
    await scene.log("done", job)
