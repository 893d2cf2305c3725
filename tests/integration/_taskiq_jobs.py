"""The taskiq app of ``test_taskiq.py``, started as a user starts one:

* ``taskiq worker tests.integration._taskiq_jobs:broker``
* ``taskiq scheduler tests.integration._taskiq_jobs:scheduler --update-interval 1``

A Redis stream broker (acknowledged deliveries) and a Redis schedule source for the delayed
re-kicks; the task bodies are in ``_job_bodies.py`` (shared with the arq worker).
"""

from __future__ import annotations

from taskiq import Context, TaskiqDepends, TaskiqEvents, TaskiqScheduler, TaskiqState
from taskiq_redis import ListRedisScheduleSource, RedisStreamBroker

from asynclock.integrations.taskiq import check_tries, retry_on_lock_conflict
from tests.integration import _job_bodies as bodies
from tests.integration._job_bodies import FAIR, FAIR_ATTEMPTS, LOCK_TTL, UNIT


def make_broker(namespace: str | None = None, url: str = bodies.REDIS_URL) -> RedisStreamBroker:
    """The workers' broker (the test process kicks through one of its own, of its namespace)."""
    return RedisStreamBroker(
        url,
        queue_name=bodies.queue_name("taskiq", namespace),
        consumer_group_name="workers",
        consumer_id="0",  # tasks kicked before the first worker declared the group still count
        xread_block=200,
    )


broker = make_broker()
# no ':' in the prefix: taskiq-redis reads a past minute's schedules back by splitting the key
# on ':' (ListRedisScheduleSource._parse_time_key), so a retry due just before a minute
# boundary would never be sent (retry_on_lock_conflict refuses such a source)
source = ListRedisScheduleSource(
    bodies.REDIS_URL, prefix=bodies.queue_name("taskiq").replace(":", "-") + "-schedule"
)
scheduler = TaskiqScheduler(broker, sources=[source])


@broker.on_event(TaskiqEvents.WORKER_STARTUP)
async def startup(state: TaskiqState) -> None:
    state.scene = bodies.Scene.open()
    await state.scene.warm()


@broker.on_event(TaskiqEvents.WORKER_SHUTDOWN)
async def shutdown(state: TaskiqState) -> None:
    await state.scene.close()


def _try(context: Context) -> int:
    return int(context.message.labels.get("_retries", 0)) + 1


@broker.task(task_name="first_message")
@retry_on_lock_conflict(
    wait=lambda n: n * UNIT,
    attempts=3,
    on_exhaustion="process_without_lock",
    lock_ttl=LOCK_TTL,
    schedule_source=source,
    fair=FAIR,
)
async def first_message(contact: int, message: int, context: Context = TaskiqDepends()) -> None:
    await bodies.first_message(
        context.state.scene, context.message.task_id, contact, message, _try(context)
    )


async def _exhausted(context: Context) -> None:
    await bodies.exhausted(context.state.scene, context.message.task_id)


@broker.task(task_name="fair_job")
@retry_on_lock_conflict(
    wait=UNIT,
    jitter=1.0,
    attempts=FAIR_ATTEMPTS,
    on_exhaustion=_exhausted,
    schedule_source=source,
    fair=FAIR,
)
async def fair_job(context: Context = TaskiqDepends()) -> None:
    await bodies.fair_job(context.state.scene, context.message.task_id, _try(context))


@broker.task(task_name="per_customer")
@retry_on_lock_conflict(
    wait=UNIT, jitter=1.0, attempts=FAIR_ATTEMPTS, schedule_source=source, fair=FAIR
)
async def per_customer(customer: int, context: Context = TaskiqDepends()) -> None:
    await bodies.per_customer(context.state.scene, context.message.task_id, customer, _try(context))


check_tries(broker)
