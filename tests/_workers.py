"""Entry points of the OS processes that ``conformance/test_processes.py`` spawns.

They live outside the test module so a spawned interpreter imports only this (and asynclock),
not pytest's collection. Each process runs its own event loop with its own state, built from the
URL and options it is given, and reports back a plain dict through a queue: never raises, so the
parent always gets an answer (an ``"error"`` entry with the traceback when something failed).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from asynclock import AsyncLock, Deduper, state_from_url
from tests._helpers import token_of
from tests.support.processes import report_back

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

#: How long a worker waits for its siblings at the start line.
BARRIER_TIMEOUT = 60.0


def redis_client(url: str) -> Any:
    """A plain redis-py client of the server(s) behind a lock state's URL, for checks that look
    at the server directly: ``Redis`` for ``redis://``, ``RedisCluster`` for
    ``redis+cluster://[user:password@]host:port[,host:port...]`` (commands routed by key slot).
    The caller closes it (``aclose``)."""
    from redis.asyncio import Redis, RedisCluster
    from redis.asyncio.cluster import ClusterNode

    parts = urlsplit(url)
    if parts.scheme != "redis+cluster":
        return Redis.from_url(url)
    hosts = parts.netloc.rpartition("@")[2]
    nodes = []
    for node in hosts.split(","):
        host, sep, port = node.strip().rpartition(":")
        nodes.append(ClusterNode(host.strip("[]") or "127.0.0.1", int(port) if sep else 6379))
    return RedisCluster(
        startup_nodes=nodes,
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
    )


#: the backends of ``tests/_matrix.py`` whose server the checks above can reach
REDIS_BACKENDS = frozenset({"redis", "redis-cluster"})


def lock_worker(
    url: str,
    options: dict[str, object],
    key: str,
    counter_key: str | None,
    tasks: int,
    rounds: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Contend for ``key``; record each critical section as ``(start, end, token, pid)``.

    With ``counter_key`` (Redis or Redis Cluster), each critical section also INCRs a counter on the server and
    DECRs it on the way out; ``most_inside`` is the largest value any process saw.
    """
    report_back(results, _contend(url, options, key, counter_key, tasks, rounds, barrier))


async def _contend(
    url: str,
    options: dict[str, object],
    key: str,
    counter_key: str | None,
    tasks: int,
    rounds: int,
    barrier: Barrier,
) -> dict[str, Any]:
    intervals: list[tuple[float, float, int, int]] = []
    most_inside = 0
    counter: Any = None
    if counter_key is not None:
        counter = redis_client(url)
    state = state_from_url(url, **options)
    try:
        await state.inspect(key)  # connected before the start line
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)

        async def task() -> None:
            nonlocal most_inside
            for _ in range(rounds):
                async with AsyncLock(state, key, ttl=10.0, timeout=60.0) as lock:
                    start = time.time()
                    if counter is not None:
                        most_inside = max(most_inside, int(await counter.incr(counter_key)))
                    await asyncio.sleep(0.002)
                    if counter is not None:
                        await counter.decr(counter_key)
                    intervals.append((start, time.time(), token_of(lock), os.getpid()))

        await asyncio.gather(*(task() for _ in range(tasks)))
    finally:
        await state.aclose()
        if counter is not None:
            await counter.aclose()
    return {"intervals": intervals, "most_inside": most_inside, "pid": os.getpid()}


def dedupe_worker(
    url: str,
    options: dict[str, object],
    ids: list[str],
    seed: int,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Call ``first_seen`` on every id (in an order of its own); report the ids it saw first."""
    report_back(results, _first_seen_all(url, options, ids, seed, barrier))


async def _first_seen_all(
    url: str, options: dict[str, object], ids: list[str], seed: int, barrier: Barrier
) -> dict[str, Any]:
    order = list(ids)
    random.Random(seed).shuffle(order)
    state = state_from_url(url, **options)
    try:
        dedupe = Deduper(state, ttl=600.0, namespace="procs")
        await state.inspect("warm-up")
        await asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT)
        answers = await asyncio.gather(*(dedupe.first_seen(i) for i in order))
    finally:
        await state.aclose()
    fresh = [i for i, new in zip(order, answers, strict=True) if new]
    return {"fresh": fresh, "pid": os.getpid()}
