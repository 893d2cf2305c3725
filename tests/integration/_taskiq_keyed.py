"""The taskiq app of ``test_taskiq_keyed.py``: tasks serialized and deduplicated per key.

Started as a user starts one: ``taskiq worker tests.integration._taskiq_keyed:broker``. A Redis
stream broker (acknowledged deliveries, so a killed worker's task is delivered again after
``idle_timeout``) with asynclock's :class:`LockMiddleware` and :class:`UniqueMiddleware` on the
state the test names. Configured by the environment the test sets:

* ``KEYED_NAMESPACE``: the test's namespace (queue name, key prefix, event log);
* ``KEYED_STATE_URL``: the state of the middlewares (Redis, PostgreSQL or MariaDB);
* ``KEYED_REDIS_URL``: the broker's Redis, which also holds the event log.

Every task appends to one event log (a Redis list: one total order over every process):
``ready <pid>`` when a worker started, ``start <key> <n> <token> <pid> <task id>`` once a task
holds its key, ``end <key> <n> <token>`` when it returns.
"""

from __future__ import annotations

import asyncio
import os

from redis.asyncio import Redis
from taskiq import Context, TaskiqDepends, TaskiqEvents, TaskiqState
from taskiq_redis import RedisStreamBroker

from asynclock import state_from_url
from asynclock.integrations.taskiq import LockMiddleware, UniqueMiddleware, lock_token
from tests._helpers import reply

NAMESPACE = os.environ.get("KEYED_NAMESPACE", "unset")
STATE_URL = os.environ.get("KEYED_STATE_URL", "redis://127.0.0.1:6379/0")
REDIS_URL = os.environ.get("KEYED_REDIS_URL", "redis://127.0.0.1:6379/0")
#: seconds of a key's lock between renewals: a killed worker's key frees after this
LOCK_TTL = 1.0
#: seconds a unique reservation lives unless renewed
UNIQUE_TTL = 3.0
#: ms a delivered, unacknowledged message waits before another worker claims it; above the
#: longest a live task waits for its key plus runs, so only a dead worker's tasks are claimed
IDLE_MS = 5000


def log_key(namespace: str) -> str:
    return f"asynclock-test:{namespace}:keyed-log"


def make_broker(namespace: str, state_url: str, redis_url: str) -> RedisStreamBroker:
    """The app's broker (the test process kicks through one of its own, of its namespace)."""
    made = RedisStreamBroker(
        redis_url,
        queue_name=f"asynclock-test:{namespace}:keyed",
        consumer_group_name="workers",
        consumer_id="0",  # tasks kicked before the first worker declared the group still count
        xread_block=200,
        idle_timeout=IDLE_MS,
    )
    state = state_from_url(state_url, prefix=f"asynclock-test:{namespace}:")
    made.add_middlewares(
        LockMiddleware(state, ttl=LOCK_TTL), UniqueMiddleware(state, ttl=UNIQUE_TTL)
    )
    made.state.locks = state

    @made.on_event(TaskiqEvents.WORKER_STARTUP)
    async def startup(app: TaskiqState) -> None:
        app.log = Redis.from_url(redis_url)
        await reply(app.log.rpush(log_key(namespace), f"ready {os.getpid()}"))

    @made.on_event(TaskiqEvents.WORKER_SHUTDOWN)
    async def shutdown(app: TaskiqState) -> None:
        await app.log.aclose()
        await app.locks.aclose()

    @made.task(task_name="keyed", lock_key="k:{key}", unique_key="u:{key}:{n}")
    async def keyed(key: str, n: int, hold: float, context: Context = TaskiqDepends()) -> None:
        log: Redis = context.state.log
        token, task = lock_token(), context.message.task_id
        earlier = await reply(log.lrange(log_key(namespace), 0, -1))
        again = any(entry.decode().endswith(f" {task}") for entry in earlier)
        await reply(log.rpush(log_key(namespace), f"start {key} {n} {token} {os.getpid()} {task}"))
        if not again:  # a delivery after a crash does its work at once
            await asyncio.sleep(hold)
        await reply(log.rpush(log_key(namespace), f"end {key} {n} {token}"))

    return made


broker = make_broker(NAMESPACE, STATE_URL, REDIS_URL)
