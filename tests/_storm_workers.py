"""Entry points of the OS processes that ``conformance/test_storm.py`` spawns.

Each process delivers its share of the webhook storm (:mod:`asynclock.cli._storm`) with its own
event loop and its own lock state (built from the lock URL: a single Redis, Redis Cluster's
``redis+cluster://``, PostgreSQL or MySQL), against a "database" kept on the Redis server itself
(:class:`RedisConversations`), so the find and the create of find-or-create are real round
trips and every process sees the same conversations. Like ``tests/_workers.py``, a worker never
raises: it reports a plain dict (an ``"error"`` entry with the traceback when something failed).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from redis.asyncio import Redis

from asynclock import AsyncLock, state_from_url
from asynclock.cli._storm import Message, StormHandler, lock_key, run_storm, storm_handler
from tests._helpers import reply
from tests.support.processes import report_back

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier, Event

    from asynclock._retry.decorator import WaitSpec
    from asynclock.cli._storm import Variant

#: How long a worker waits for its siblings at the start line, or for the holder's signal.
START_TIMEOUT = 60.0


class RedisConversations:
    """The storm's database on Redis: every key starts with ``prefix`` (the test's namespace), on whatever
    Redis server the test names (the lock state may live elsewhere).

    ``{prefix}db:contacts`` (set of contacts), ``{prefix}db:contact:<id>`` (list of its
    conversation ids, oldest first), ``{prefix}db:conversation:<id>`` (list of message ids),
    ``{prefix}db:ids`` (the id sequence). Find, create and append are separate round trips, as
    with a SQL database without a unique index on "active conversation per contact".
    """

    def __init__(self, client: Redis, prefix: str) -> None:
        self._client = client
        self._prefix = f"{prefix}db:"

    async def find_active(self, contact: int) -> int | None:
        found = await reply(self._client.lindex(f"{self._prefix}contact:{contact}", 0))
        return int(found) if found is not None else None

    async def create(self, contact: int) -> int:
        conversation = int(await reply(self._client.incr(f"{self._prefix}ids")))
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.rpush(f"{self._prefix}contact:{contact}", conversation)
            pipe.sadd(f"{self._prefix}contacts", contact)
            await pipe.execute()
        return conversation

    async def append(self, conversation: int, message: int) -> None:
        await reply(self._client.rpush(f"{self._prefix}conversation:{conversation}", message))

    async def snapshot(self) -> dict[int, dict[int, list[int]]]:
        stored: dict[int, dict[int, list[int]]] = {}
        for contact in sorted(
            int(c) for c in await reply(self._client.smembers(f"{self._prefix}contacts"))
        ):
            ids = [
                int(c)
                for c in await reply(self._client.lrange(f"{self._prefix}contact:{contact}", 0, -1))
            ]
            stored[contact] = {
                c: [
                    int(m)
                    for m in await reply(
                        self._client.lrange(f"{self._prefix}conversation:{c}", 0, -1)
                    )
                ]
                for c in ids
            }
        return stored


def make_wait(kind: str, step: float) -> WaitSpec:
    """A picklable description of ``wait`` turned into the real thing in the worker process.

    ``("linear", s)`` is ``wait=lambda n: s * n``; ``("fixed", s)`` is ``wait=s``.
    """
    if kind == "linear":
        return lambda executions: step * executions
    if kind == "fixed":
        return step
    raise ValueError(f"unknown wait kind {kind!r}")


def storm_worker(
    url: str,
    options: dict[str, object],
    db_url: str,
    db_prefix: str,
    variant: Variant,
    messages: list[tuple[int, int]],
    settings: dict[str, Any],
    go: Event | None,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """Deliver ``messages`` (``(id, contact)`` pairs) at once through the ``variant`` handler.

    ``settings``: ``ttl``, ``gap``, ``wait`` (a ``(kind, step)`` pair for :func:`make_wait`),
    ``attempts``, ``jitter``. With ``go``, the deliveries start only once it is set (after the
    start line).
    """
    report_back(
        results,
        _deliver(url, options, db_url, db_prefix, variant, messages, settings, go, barrier),
    )


async def _deliver(
    url: str,
    options: dict[str, object],
    db_url: str,
    db_prefix: str,
    variant: Variant,
    messages: list[tuple[int, int]],
    settings: dict[str, Any],
    go: Event | None,
    barrier: Barrier,
) -> dict[str, Any]:
    client: Redis = Redis.from_url(db_url)
    state = state_from_url(url, **options)
    try:
        db = RedisConversations(client, db_prefix)
        handler: StormHandler = storm_handler(
            variant,
            state,
            db,
            ttl=settings["ttl"],
            gap=settings["gap"],
            wait=make_wait(*settings["wait"]),
            attempts=settings["attempts"],
            jitter=settings["jitter"],
        )
        await state.inspect("warm-up")  # connected before the start line
        await client.ping()
        await asyncio.to_thread(barrier.wait, START_TIMEOUT)
        if go is not None and not await asyncio.to_thread(go.wait, START_TIMEOUT):
            raise TimeoutError("the holder never signalled")
        processed, wall_time = await run_storm(handler, [Message(i, c) for i, c in messages])
        stats = handler.statistics()
    finally:
        await state.aclose()
        await client.aclose()
    return {
        "pid": os.getpid(),
        "processed": processed,
        "wall_time": wall_time,
        "statistics": asdict(stats) if stats is not None else None,
        "overran": len(handler.overran),
    }


def holder_worker(
    url: str,
    options: dict[str, object],
    db_url: str,
    db_prefix: str,
    messages: list[tuple[int, int]],
    ttl: float,
    hold: float,
    go: Event,
    barrier: Barrier,
    results: Queue[dict[str, Any]],
) -> None:
    """The slow first handler: for each message (one per contact), take the contact's lock,
    find (no conversation yet), set ``go``, then stay ``hold`` seconds between the find and
    the create, still inside the lock (``hold`` < ``ttl``)."""
    report_back(results, _hold(url, options, db_url, db_prefix, messages, ttl, hold, go, barrier))


async def _hold(
    url: str,
    options: dict[str, object],
    db_url: str,
    db_prefix: str,
    messages: list[tuple[int, int]],
    ttl: float,
    hold: float,
    go: Event,
    barrier: Barrier,
) -> dict[str, Any]:
    client: Redis = Redis.from_url(db_url)
    state = state_from_url(url, **options)
    try:
        db = RedisConversations(client, db_prefix)
        await state.inspect("warm-up")
        await client.ping()
        await asyncio.to_thread(barrier.wait, START_TIMEOUT)
        waiting = len(messages)
        all_found = asyncio.Event()
        inside: list[float] = []

        async def slow_first_message(message_id: int, contact: int) -> None:
            async with AsyncLock(state, lock_key(contact), ttl=ttl, blocking=False) as lock:
                conversation = await db.find_active(contact)
                assert conversation is None, "the holder must be the first handler"
                nonlocal waiting
                waiting -= 1
                if waiting == 0:
                    go.set()  # every lock is held and every find answered "none"
                    all_found.set()
                await all_found.wait()
                start = asyncio.get_running_loop().time()
                await asyncio.sleep(hold)
                conversation = await db.create(contact)
                await db.append(conversation, message_id)
                inside.append(asyncio.get_running_loop().time() - start)
                assert lock.owned

        await asyncio.gather(*(slow_first_message(i, c) for i, c in messages))
    finally:
        await state.aclose()
        await client.aclose()
    return {"pid": os.getpid(), "processed": len(messages), "held": inside}
