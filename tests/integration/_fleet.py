"""Job-queue worker processes for the integration tests, and what their event log shows.

:class:`Workers` starts a framework's worker command (as a user would) with the scene's
environment (see ``_job_bodies.py``), kills one with SIGKILL, stops the rest with SIGTERM, and
keeps each one's output for the failure message. :class:`Log` reads the shared event log.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests._helpers import reply
from tests._matrix import REDIS
from tests.support.processes import WorkerProcesses, kill_group

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Awaitable, Callable

if TYPE_CHECKING:
    from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[2]


class Workers(WorkerProcesses):
    """The worker processes of one test (one namespace)."""

    def __init__(self, namespace: str, *, unit: float, fair: bool) -> None:
        super().__init__("job-workers-")
        self.namespace = namespace
        self.env = {
            **os.environ,
            "JOBS_NAMESPACE": namespace,
            "JOBS_UNIT": repr(unit),
            "JOBS_FAIR": "1" if fair else "0",
            "JOBS_REDIS_URL": REDIS.url,
            "PYTHONPATH": str(ROOT),
        }

    def start(self, *command: str) -> subprocess.Popen[bytes]:
        # its own process group: a command that forks workers (taskiq) is killed whole
        return self.launch(command, cwd=ROOT, env=self.env)

    def kill_group_of(self, pid: int) -> subprocess.Popen[bytes]:
        """SIGKILL the started command whose process group holds ``pid`` (a forked worker)."""
        group = os.getpgid(pid)
        for process in self.processes:
            if process.pid == group and process.poll() is None:
                kill_group(process)
                return process
        raise AssertionError(f"pid {pid} is not in a running worker's process group")

    def output(self, tail: int | None = 3000) -> str:
        return super().output(tail)

    def stop(self, within: float = 15.0) -> list[int]:
        return super().stop(within)


@dataclass
class Log:
    """The event log of one scene (``_job_bodies.py``): ``(event, job, *rest)`` in total order."""

    entries: list[tuple[str, ...]]

    @classmethod
    async def read(cls, redis: Redis, key: str) -> Log:
        raw = await reply(redis.lrange(key, 0, -1))
        return cls([tuple(item.decode().split(" ")) for item in raw])

    def jobs(self, event: str) -> list[str]:
        """The jobs with ``event``, in the order of their first such entry."""
        return list(dict.fromkeys(e[1] for e in self.entries if e[0] == event))

    def count(self, event: str) -> int:
        return sum(1 for e in self.entries if e[0] == event)

    def first_conflicts(self) -> list[str]:
        """Jobs in the order they first met the lock busy (their first ``conflict`` entry)."""
        return self.jobs("conflict")

    def inversions(self) -> tuple[int, int]:
        """(pairs served against their first-conflict order, pairs compared)."""
        rank = {job: n for n, job in enumerate(self.first_conflicts())}
        served = [job for job in self.jobs("locked") if job in rank]
        pairs = list(itertools.combinations(served, 2))
        return sum(1 for a, b in pairs if rank[a] > rank[b]), len(pairs)

    def exhausted_before_younger(self) -> int:
        """Jobs that exhausted their attempts after a younger job had taken the lock."""
        rank = {job: n for n, job in enumerate(self.first_conflicts())}
        locked_so_far: list[str] = []
        violations = 0
        for event, job, *_ in self.entries:
            if event == "locked":
                locked_so_far.append(job)
            elif event == "exhausted" and any(
                rank.get(other, -1) > rank.get(job, -1) for other in locked_so_far
            ):
                violations += 1
        return violations


async def until(predicate: object, *, within: float, what: str, workers: Workers) -> None:
    """Poll ``predicate`` (an async callable) every 20 ms; fail with the workers' output."""
    assert callable(predicate)
    deadline = time.monotonic() + within
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within} s\n{workers.output()}")
        await asyncio.sleep(0.02)


CONTACTS, MESSAGES = 20, 6


@dataclass
class StormOutcome:
    """What the storm left in the conversations "database" and the event log."""

    conversations: dict[int, dict[int, list[int]]]
    log: Log

    @property
    def duplicates(self) -> int:
        return sum(len(found) - 1 for found in self.conversations.values())

    @property
    def stored(self) -> list[int]:
        return sorted(
            m for found in self.conversations.values() for ms in found.values() for m in ms
        )

    @property
    def retries(self) -> int:
        return sum(1 for e in self.log.entries if e[0] == "try" and e[2] != "1")

    def check(self, framework: str) -> str:
        """Assert the seed's three zeros; the summary line for the report."""
        assert sorted(self.conversations) == list(range(CONTACTS))
        assert self.duplicates == 0, self.conversations
        assert self.stored == list(range(CONTACTS * MESSAGES))  # none lost, none twice
        assert self.log.count("done") == CONTACTS * MESSAGES
        assert self.retries, "the storm met no conflict: it tested nothing"
        return (
            f"{framework} storm: {self.retries} retries through {framework}, "
            f"{self.log.count('granted')} processed without the lock, {self.duplicates} "
            f"duplicates, {len(self.stored)} of {CONTACTS * MESSAGES} stored once"
        )


async def storm_outcome(redis: Redis, namespace: str) -> StormOutcome:
    from tests._storm_workers import RedisConversations
    from tests.integration._job_bodies import log_key

    conversations = await RedisConversations(redis, f"asynclock-test:{namespace}:").snapshot()
    return StormOutcome(conversations, await Log.read(redis, log_key(namespace)))


async def _ready(redis: Redis, namespace: str, count: int) -> bool:
    return (await events(redis, namespace)).count("ready") >= count


async def events(redis: Redis, namespace: str) -> Log:
    from tests.integration._job_bodies import log_key

    return await Log.read(redis, log_key(namespace))


async def fairness(
    redis: Redis,
    namespace: str,
    workers: Workers,
    kick: Callable[[], Awaitable[None]],
    *,
    jobs: int,
    ready: int,
    apart: float,
    held_after: float,
    within: float,
) -> tuple[int, int, int, Log]:
    """Once ``ready`` workers warmed up: one slow holder of the hot key, ``jobs`` jobs kicked
    ``apart`` seconds apart meeting it;
    the holder lets go ``held_after`` seconds after the last. Returns (inversions, pairs,
    exhaustions after a younger job was served, the log)."""
    from asynclock import AsyncLock, RedisState

    state = RedisState.from_url(REDIS.url, prefix=f"asynclock-test:{namespace}:")
    holder = AsyncLock(state, "hot", ttl=60.0)
    try:
        await until(
            lambda: _ready(redis, namespace, ready),
            within=30,
            what="workers warmed up",
            workers=workers,
        )
        await holder.acquire()
        for _ in range(jobs):
            await kick()
            await asyncio.sleep(apart)
        await asyncio.sleep(held_after)
        await holder.release()

        async def all_finished() -> bool:
            log = await events(redis, namespace)
            return len(set(log.jobs("done")) | set(log.jobs("exhausted"))) == jobs

        await until(
            all_finished, within=within, what="every fairness job finished", workers=workers
        )
    finally:
        await state.aclose()
    log = await events(redis, namespace)
    inversions, pairs = log.inversions()
    return inversions, pairs, log.exhausted_before_younger(), log


async def per_customer_outcome(redis: Redis, namespace: str, jobs: int) -> tuple[int, int]:
    """The per-customer scene once every job is done: (most jobs inside at once, tries)."""
    log = await events(redis, namespace)
    inside = [int(e[2]) for e in log.entries if e[0] == "inside"]
    assert len(log.jobs("done")) == jobs, log.entries
    assert len(inside) == jobs, log.entries
    return max(inside), log.count("try")
