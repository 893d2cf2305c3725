"""The arq worker of ``test_arq.py``: ``python -m arq tests.integration._arq_jobs.WorkerSettings``.

Jobs as an arq user writes them, with :func:`asynclock.integrations.arq.retry_on_lock_conflict`;
the bodies are in ``_job_bodies.py`` (shared with the taskiq worker).
"""

from __future__ import annotations

from typing import Any

from arq.connections import RedisSettings

from asynclock.integrations.arq import check_tries, retry_on_lock_conflict
from tests.integration import _job_bodies as bodies
from tests.integration._job_bodies import FAIR, FAIR_ATTEMPTS, LOCK_TTL, UNIT


@retry_on_lock_conflict(
    wait=lambda n: n * UNIT,
    attempts=3,
    on_exhaustion="process_without_lock",
    lock_ttl=LOCK_TTL,
    fair=FAIR,
)
async def first_message(ctx: dict[str, Any], contact: int, message: int) -> None:
    await bodies.first_message(ctx["scene"], ctx["job_id"], contact, message, ctx["job_try"])


async def _exhausted(ctx: dict[str, Any]) -> None:
    await bodies.exhausted(ctx["scene"], ctx["job_id"])


@retry_on_lock_conflict(
    wait=UNIT, jitter=1.0, attempts=FAIR_ATTEMPTS, on_exhaustion=_exhausted, fair=FAIR
)
async def fair_job(ctx: dict[str, Any]) -> None:
    await bodies.fair_job(ctx["scene"], ctx["job_id"], ctx["job_try"])


@retry_on_lock_conflict(wait=UNIT, jitter=1.0, attempts=FAIR_ATTEMPTS, fair=FAIR)
async def per_customer(ctx: dict[str, Any], customer: int) -> None:
    await bodies.per_customer(ctx["scene"], ctx["job_id"], customer, ctx["job_try"])


async def startup(ctx: dict[str, Any]) -> None:
    ctx["scene"] = bodies.Scene.open()
    await ctx["scene"].warm()


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["scene"].close()


@check_tries
class WorkerSettings:
    functions = [first_message, fair_job, per_customer]  # noqa: RUF012 - arq reads class attributes
    queue_name = bodies.queue_name("arq")
    redis_settings = RedisSettings.from_dsn(bodies.REDIS_URL)
    on_startup = startup
    on_shutdown = shutdown
    max_tries = FAIR_ATTEMPTS
    max_jobs = 40
    poll_delay = 0.02
    job_timeout = 30
    keep_result = 0
