"""taskiq's LockMiddleware and UniqueMiddleware in real ``taskiq worker`` processes.

Two workers (the command a user runs) over a Redis stream broker, the middlewares' state on each
server backend; one worker is killed with SIGKILL while its task holds a key. The app is
``_taskiq_keyed.py``; its event log (one Redis list) is the total order the checks read.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING

import pytest

from asynclock.integrations.taskiq import TaskAlreadyQueuedError
from tests._helpers import reply
from tests._matrix import MYSQL, POSTGRES, REDIS, Backend, purge_namespace, require
from tests.integration import _taskiq_keyed as app
from tests.integration._fleet import ROOT, Workers, until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from redis.asyncio import Redis
    from taskiq import AsyncTaskiqDecoratedTask
    from taskiq_redis import RedisStreamBroker

    from asynclock import State

pytestmark = [pytest.mark.processes, pytest.mark.slow, pytest.mark.timeout(150)]

WORKER = (
    sys.executable, "-m", "taskiq", "worker", "tests.integration._taskiq_keyed:broker",
    "--workers", "1", "--no-configure-logging",
)  # fmt: skip


@pytest.fixture(
    params=[
        pytest.param(REDIS, id="redis", marks=pytest.mark.redis),
        pytest.param(POSTGRES, id="postgres", marks=[pytest.mark.postgres, pytest.mark.redis]),
        pytest.param(MYSQL, id="mysql", marks=[pytest.mark.mysql, pytest.mark.redis]),
    ]
)
async def backend(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Backend]:
    chosen: Backend = request.param
    require(chosen)
    yield chosen
    if chosen is not REDIS:
        await purge_namespace(chosen, namespace)


@pytest.fixture
async def client(backend: Backend, namespace: str) -> AsyncIterator[RedisStreamBroker]:
    """The kicking side: the app's broker and middlewares, in the test process."""
    made = app.make_broker(namespace, backend.url, REDIS.url)
    await made.startup()
    yield made
    await made.shutdown()
    await made.state.locks.aclose()


class Events:
    """The app's event log: ``(event, key, n, token, pid, task)`` tuples in total order."""

    def __init__(self, redis: Redis, namespace: str) -> None:
        self.redis = redis
        self.key = app.log_key(namespace)
        self.entries: list[list[str]] = []

    async def read(self) -> Events:
        self.entries = [
            e.decode().split(" ") for e in await reply(self.redis.lrange(self.key, 0, -1))
        ]
        return self

    def starts(self, key: str) -> list[list[str]]:
        return [e for e in self.entries if e[0] == "start" and e[1] == key]

    def ended(self, key: str) -> list[int]:
        return [int(e[2]) for e in self.entries if e[0] == "end" and e[1] == key]

    def ready(self) -> int:
        return sum(1 for e in self.entries if e[0] == "ready")

    def overlaps(self, key: str, dead: set[str]) -> list[list[str]]:
        """Starts of ``key`` while a run of a live process had started and not ended."""
        running: list[list[str]] = []
        found: list[list[str]] = []
        for entry in self.entries:
            if entry[1:2] != [key]:
                continue
            if entry[0] == "start":
                if any(r[4] not in dead for r in running):
                    found.append(entry)
                running.append(entry)
            elif entry[0] == "end":
                running = [r for r in running if r[2] != entry[2] or r[4] in dead]
        return found


async def test_a_key_runs_one_task_at_a_time_and_a_killed_holder_frees_it_by_ttl(
    backend: Backend, namespace: str, redis: Redis, client: RedisStreamBroker
) -> None:
    keyed: AsyncTaskiqDecoratedTask[..., None] = client.find_task("keyed")  # type: ignore[assignment]
    workers = Workers(namespace, unit=1.0, fair=True)
    workers.env.update(
        KEYED_NAMESPACE=namespace, KEYED_STATE_URL=backend.url, KEYED_REDIS_URL=REDIS.url
    )
    log = Events(redis, namespace)

    async def logged(condition: object, within: float, what: str) -> None:
        async def holds() -> bool:
            await log.read()
            assert callable(condition)
            return bool(condition())

        await until(holds, within=within, what=what, workers=workers)

    for _ in range(2):
        workers.start(*WORKER)
    try:
        await logged(lambda: log.ready() == 2, 60, "two workers started")
        # unique at kiq time: while "v 0" is pending or running, the same key is not sent
        victim = await keyed.kiq("v", 0, 60.0)  # holds its key until its worker is killed
        with pytest.raises(TaskAlreadyQueuedError) as refused:
            await keyed.kiq("v", 0, 0.0)
        assert refused.value.task_id == victim.task_id
        await logged(lambda: log.starts("v"), 30, "the victim running")
        with pytest.raises(TaskAlreadyQueuedError):
            await keyed.kiq("v", 0, 0.0)
        for n in (1, 2, 3):
            await keyed.kiq("v", n, 0.1)  # wait for the key, in either worker
        for n in (0, 1, 2):
            await keyed.kiq("w", n, 0.1)  # another key: not held up by "v"
        await logged(lambda: sorted(log.ended("w")) == [0, 1, 2], 30, "w's tasks done")
        assert log.ended("v") == [], "a task ran while its key was held"
        victim_pid = log.starts("v")[0][4]
        locks: State = client.state.locks
        held = await locks.inspect("taskiq:k:v")
        assert held is not None
        assert f":{victim_pid}:" in held.owner
        workers.kill_group_of(int(victim_pid))
        killed_at = time.monotonic()
        # the dead holder's key frees by its TTL (no renewal any more), whoever takes it next
        while (now := await locks.inspect("taskiq:k:v")) is not None and now.owner == held.owner:
            assert time.monotonic() - killed_at < app.LOCK_TTL + 5.0, "not freed by its TTL"
            await asyncio.sleep(0.05)
        freed_after = time.monotonic() - killed_at
        await clear_orphaned_autoclaim_lock(redis, namespace)
        await logged(
            lambda: sorted(log.ended("v")) == [0, 1, 2, 3],
            60,
            "every v task done (the killed one delivered again)",
        )
        again = await keyed.kiq("v", 0, 0.0)  # done: the key is free again
        await logged(lambda: log.ended("v").count(0) == 2, 30, "the new v 0 done")
        assert again.task_id != victim.task_id
    finally:
        workers.stop()
        await reply(redis.delete(log.key))
    dead = {victim_pid}
    for key in ("v", "w"):
        assert log.overlaps(key, dead) == [], log.entries
        tokens = [int(e[3]) for e in log.starts(key)]
        assert tokens == sorted(set(tokens)), log.entries  # strictly increasing
    # the killed run started, never ended; its task was run again by the other worker
    runs_of_victim = [e for e in log.starts("v") if e[5] == victim.task_id]
    assert next(e[4] for e in runs_of_victim) == victim_pid
    assert len(runs_of_victim) == 2, log.entries
    assert runs_of_victim[1][4] != victim_pid, log.entries
    print(
        f"\ntaskiq keyed ({backend.name}): {len(log.entries)} events; the killed holder's key "
        f"freed {freed_after:.2f} s after the kill (lock TTL {app.LOCK_TTL} s)"
    )


async def clear_orphaned_autoclaim_lock(redis: Redis, namespace: str) -> None:
    """Delete taskiq-redis's XAUTOCLAIM lock if the killed worker died holding it.

    taskiq-redis (1.0-1.2) takes that lock without a timeout (taskiq-redis#131): a worker killed
    inside its XAUTOCLAIM leaves it forever, and no worker reclaims a dead worker's messages
    again. An operator deletes it; so does this test, when the same holder keeps it across half
    a second (a live worker takes a new one, with a new token, on every pass).
    """
    name = f"autoclaim:workers:asynclock-test:{namespace}:keyed"
    first = await reply(redis.get(name))
    if first is None:
        return
    for _ in range(5):
        await asyncio.sleep(0.1)
        if await reply(redis.get(name)) != first:
            return
    print(f"\ndeleting {name}, orphaned by the killed worker (taskiq-redis#131)")
    await reply(redis.delete(name))


@pytest.mark.redis
async def test_the_example_app_charges_one_invoice_at_a_time_and_refuses_a_second_report(
    namespace: str, redis: Redis
) -> None:
    """``examples/taskiq_app.py`` as documented: two ``taskiq worker`` processes, then
    ``python -m examples.taskiq_app`` kicks ten read-work-write charges of one invoice and one
    day's report twice. Every charge counts (the balance is 1,000), and the second report kiq
    is refused with the first one's task id."""
    prefix = f"asynclock-test:{namespace}:"
    workers = Workers(namespace, unit=1.0, fair=True)
    workers.env.update(
        ASYNCLOCK_STATE_URL=REDIS.url,
        ASYNCLOCK_PREFIX=prefix,
        TASKIQ_BROKER_URL=REDIS.url,
        TASKIQ_QUEUE=f"{prefix}app",
        ASYNCLOCK_EXAMPLE_DELAY="0.05",
    )
    balance = f"{prefix}invoice:7:balance"
    for _ in range(2):
        workers.start(
            sys.executable, "-m", "taskiq", "worker", "examples.taskiq_app:broker",
            "--workers", "1", "--no-configure-logging",
        )  # fmt: skip
    try:
        kicker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "examples.taskiq_app",
            cwd=ROOT,
            env=workers.env,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(kicker.communicate(), 120)
        assert kicker.returncode == 0, stderr.decode()
        assert "not sent: the report of that day is task" in stderr.decode()

        async def charged() -> bool:
            return bool(await reply(redis.get(balance)) == b"1000")

        await until(charged, within=120, what="ten charges of 100", workers=workers)
    finally:
        workers.stop()
