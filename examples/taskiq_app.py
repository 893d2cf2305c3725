"""taskiq tasks serialized per key and deduplicated at ``kiq`` time with asynclock's middlewares.

Run the workers (Redis on 127.0.0.1:6379), as many as you like, then kick some tasks::

    taskiq worker examples.taskiq_app:broker
    python -m examples.taskiq_app

* ``charge(invoice_id, cents)`` runs under ``LockMiddleware``: one charge per invoice at a time,
  across every worker, in arrival order per worker. It reads the invoice's balance, works, and
  writes it back: without the lock two workers would read the same balance and one charge would
  be lost. Its write is *fenced*: the store refuses a write with a fencing token lower than one
  it has seen, so a charge whose lock ran out (a worker stalled for ``ttl``) cannot overwrite a
  newer one.
* ``daily_report(day)`` runs under ``UniqueMiddleware``: a second ``kiq`` of a day whose report
  is pending or running sends nothing and raises ``TaskAlreadyQueuedError`` (with the pending
  task's id), until that report ends.

Environment: ``ASYNCLOCK_STATE_URL`` (where the locks live: Redis, PostgreSQL or MySQL),
``ASYNCLOCK_PREFIX``, ``TASKIQ_BROKER_URL`` (the Redis of the stream broker and of the example's
"database"), ``TASKIQ_QUEUE``, ``ASYNCLOCK_EXAMPLE_DELAY`` (seconds a charge works).
"""

from __future__ import annotations

import asyncio
import logging
import os

from redis.asyncio import Redis
from taskiq import TaskiqEvents, TaskiqState
from taskiq_redis import RedisStreamBroker

from asynclock import state_from_url
from asynclock.integrations.taskiq import (
    LockMiddleware,
    TaskAlreadyQueuedError,
    UniqueMiddleware,
    lock_token,
)

log = logging.getLogger("examples.taskiq_app")

STATE_URL = os.environ.get("ASYNCLOCK_STATE_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("ASYNCLOCK_PREFIX", "taskiq-app:")
BROKER_URL = os.environ.get("TASKIQ_BROKER_URL", "redis://127.0.0.1:6379/0")
DELAY = float(os.environ.get("ASYNCLOCK_EXAMPLE_DELAY", "0.05"))

broker = RedisStreamBroker(
    BROKER_URL, queue_name=os.environ.get("TASKIQ_QUEUE", "taskiq-app"), consumer_id="0"
)
locks = state_from_url(STATE_URL, prefix=PREFIX)
broker.add_middlewares(
    LockMiddleware(locks, ttl=30.0),  # renewed every 10 s while a task runs
    UniqueMiddleware(locks, ttl=600.0),  # a pending report keeps its day for 10 minutes
)

#: KEYS[1] the balance, KEYS[2] the highest fencing token it was written with
#: ARGV[1] the new balance, ARGV[2] the writer's token | 1 written, 0 refused (a stale writer)
FENCED_SET = """
local highest = tonumber(redis.call('GET', KEYS[2]) or '0')
local token = tonumber(ARGV[2])
if token < highest then return 0 end
redis.call('SET', KEYS[2], token)
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


@broker.on_event(TaskiqEvents.WORKER_STARTUP)
async def startup(state: TaskiqState) -> None:
    state.db = Redis.from_url(BROKER_URL)  # the example's "database"


@broker.on_event(TaskiqEvents.WORKER_SHUTDOWN)
async def shutdown(state: TaskiqState) -> None:
    await state.db.aclose()
    await locks.aclose()


def balance_key(invoice_id: int) -> str:
    return f"{PREFIX}invoice:{invoice_id}:balance"


# explicit task names: `python -m examples.taskiq_app` runs this module as __main__, and
# taskiq would name its tasks after that, not after the module the workers import
@broker.task(task_name="charge", lock_key="invoice:{invoice_id}")
async def charge(invoice_id: int, cents: int) -> bool:
    """Add ``cents`` to the invoice's balance: read, work, fenced write. One per invoice at a time."""
    db: Redis = broker.state.db
    balance = int(await db.get(balance_key(invoice_id)) or 0)  # read ...
    await asyncio.sleep(DELAY)  # ... the work between the read and the write ...
    token = lock_token()  # this charge's fencing token, strictly increasing per invoice
    if token is None:
        raise RuntimeError("charge runs under LockMiddleware only (its lock_key label)")
    written = await db.eval(  # type: ignore[misc]
        FENCED_SET, 2, balance_key(invoice_id), balance_key(invoice_id) + ":token",
        str(balance + cents), str(token),
    )  # fmt: skip
    log.info("invoice %s: %s -> %s (token %s)", invoice_id, balance, balance + cents, token)
    return bool(written)


@broker.task(task_name="daily_report", unique_key="report:{day}")
async def daily_report(day: str) -> str:
    """One report per day pending or running at a time."""
    await asyncio.sleep(DELAY)
    return f"report {day}"


async def main() -> None:
    """Kick ten charges of one invoice and a report twice (the second kiq is refused)."""
    await broker.startup()
    try:
        for _ in range(10):
            await charge.kiq(7, 100)  # the workers add them one at a time: 1,000 in the end
        first = await daily_report.kiq("2024-05-01")
        try:
            await daily_report.kiq("2024-05-01")
        except TaskAlreadyQueuedError as refused:
            log.info("not sent: the report of that day is task %s", refused.task_id)
        log.info("sent report task %s", first.task_id)
    finally:
        await broker.shutdown()
        await locks.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
