"""The webhook storm of issue #3 from several OS processes sharing one server.

Instagram-style first-message webhooks for many contacts, several messages each, shuffled and
delivered at once by ``PROCESSES`` spawned processes. Every handler runs find-or-create against
a database kept on the Redis server (see ``tests/_storm_workers.py``), whichever server backend
holds the locks, inside
``AsyncLock(state, f"ig:contact:{id}", ttl=T, blocking=False)``.

Every test runs once per server backend of ``tests/_matrix.py``, Redis Cluster included: there
the locks live on the three masters (each contact's lock on the master owning its slot) while
the database stays on the single Redis server. After each storm on Redis or Redis Cluster,
:func:`check_lock_homes` finds every contact's lock key (a released key keeps its last fencing
token for ``token_retention``, 60 s) on the lock server, never on the database's server, and on
a cluster spread over more than one master: the storm really went through the slot routing.

Scaled times: the origin story's 3 s TTL and ``wait=lambda n: n`` become ``STORM_TTL`` and
``wait=lambda n: STORM_STEP * n``. The slow-holder tests use longer times, chosen so that a
process stalled for ~0.3 s on a loaded 2-core machine still cannot change the outcome.
"""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pytest
from redis.asyncio import Redis

from asynclock import retry_on_lock_conflict
from asynclock.cli._storm import StormTally, lock_key, tally
from tests import _storm_workers
from tests._matrix import REDIS, TEST_PREFIX, require
from tests._workers import REDIS_BACKENDS, redis_client
from tests.support.processes import run_processes
from tests.support.storm import storm_messages

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Sequence

    from asynclock import RedisState
    from asynclock.cli._storm import Message, Variant
    from tests.conftest import Target

pytestmark = pytest.mark.processes

PROCESSES = 3

# The storm: 20 contacts x 6 messages. The TTL-aligned window: STORM_STEP + 2 * STORM_STEP =
# STORM_TTL, as wait=lambda n: n, attempts=3 against a 3 s lock. A holder's critical section
# (four round trips and GAP) takes ~40 ms; the TTL leaves it ~1 s for stalls on a loaded machine.
CONTACTS, PER_CONTACT = 20, 6
STORM_TTL = 1.0
STORM_STEP = STORM_TTL / 3
GAP = 0.03  # the database round trip between find and create, on top of the real ones

# The slow holder: it stays SLOW_HOLD s between find and create, inside a SLOW_TTL s lock.
# Short window: fixed wait 0.1 s (+ up to 15% jitter), attempts 3 -> fallback at ~0.2-0.23 s
# after the first conflict, ~0.5 s before the holder creates. Aligned window: 0.5 + 1.0 =
# 1.5 s = the TTL -> fallback ~0.75 s after the holder created. A process stalled for less
# than ~0.5 s cannot change either outcome.
SLOW_TTL = 1.5
SLOW_HOLD = 0.75
SHORT_WAIT = 0.1
ALIGNED_STEP = SLOW_TTL / 3
SLOW_CONTACTS = 3
SLOW_PER_PROCESS = 2  # messages per contact from each of the non-holder processes


@dataclass(frozen=True)
class StormDb:
    """Where the storm's "database" lives: on the Redis server (whatever backend holds the
    locks, as an app's database is not its lock store), under this test's namespace."""

    url: str
    prefix: str
    client: Redis


@pytest.fixture
async def storm_db(server_target: Target) -> AsyncIterator[StormDb]:
    require(REDIS)
    client: Redis = Redis.from_url(REDIS.url)
    db = StormDb(REDIS.url, f"{TEST_PREFIX}{server_target.namespace}:storm:", client)
    try:
        yield db
    finally:
        try:
            keys = [k async for k in client.scan_iter(match=f"{db.prefix}*", count=1000)]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


async def check_lock_homes(
    target: Target, contacts: Iterable[int], *, overran: int = 0
) -> Counter[str]:
    """Where the contacts' lock keys are now, per server (``host:port``); Redis backends only.

    Every contact's lock key must be on the lock server (but for as many as ``overran``: a
    holder that outlived its TTL lets its key expire), and, on a cluster, none on the single
    server that holds the storm's database.
    """
    state = cast("RedisState", target.open())
    client = redis_client(target.url)
    database: Redis = Redis.from_url(REDIS.url)
    homes: Counter[str] = Counter()
    missing: list[str] = []
    try:
        clustered = state.clustered
        if clustered:
            await client.initialize()
        for contact in contacts:
            name = state.lock_key(lock_key(contact))
            if not await client.exists(name):
                missing.append(name)
                continue
            if clustered:
                homes[client.get_node_from_key(name).name] += 1
                assert not await database.exists(name), f"{name} is on {REDIS.url}"
            else:
                homes[target.url] += 1
    finally:
        await database.aclose()
        await client.aclose()
        await state.aclose()
    assert len(missing) <= overran, (missing, homes)
    return homes


def deal(messages: Sequence[Message], hands: int, seed: int) -> list[list[tuple[int, int]]]:
    """Deal the (already shuffled) messages to ``hands`` processes at random."""
    rng = random.Random(seed)
    dealt: list[list[tuple[int, int]]] = [[] for _ in range(hands)]
    for message in messages:
        dealt[rng.randrange(hands)].append((message.id, message.contact))
    return dealt


def total_statistics(reports: Sequence[dict[str, Any]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for report in reports:
        for name, value in (report.get("statistics") or {}).items():
            totals[name] = totals.get(name, 0) + value
    return totals


async def storm(
    target: Target, db: StormDb, variant: Variant, seed: int
) -> tuple[StormTally, list[dict[str, Any]]]:
    """Run the storm with ``variant`` handlers in ``PROCESSES`` processes; tally the database."""
    messages = storm_messages(CONTACTS, PER_CONTACT, seed=seed)
    settings = {
        "ttl": STORM_TTL,
        "gap": GAP,
        "wait": ("linear", STORM_STEP),
        "attempts": 3,
        "jitter": 0.15,
    }
    reports = await run_processes(
        [
            (
                _storm_workers.storm_worker,
                (target.url, target.options, db.url, db.prefix, variant, hand, settings, None),
            )
            for hand in deal(messages, PROCESSES, seed)
        ]
    )
    conversations = _storm_workers.RedisConversations(db.client, db.prefix)
    overran = sum(r["overran"] for r in reports)
    counted = await tally(conversations, messages, variant, overran=overran)
    assert sum(r["processed"] for r in reports) == counted.messages - counted.lost
    if variant != "no lock" and target.backend.name in REDIS_BACKENDS:
        homes = await check_lock_homes(target, range(CONTACTS), overran=overran)
        if target.backend.name == "redis-cluster":
            # 20 keys on 3 masters: all on one master has odds of 3 ** -19
            assert len(homes) >= 2, homes
    return counted, reports


class TestWebhookStorm:
    async def test_without_a_lock_the_storm_creates_duplicates(
        self, server_target: Target, storm_db: StormDb
    ) -> None:
        # The control: the storm really races (otherwise the zeros below would prove nothing).
        counted, _ = await storm(server_target, storm_db, "no lock", seed=1)
        assert counted.duplicates > 0, counted
        assert (counted.lost, counted.processed_twice) == (0, 0), counted

    async def test_a_lock_without_retry_loses_messages(
        self, server_target: Target, storm_db: StormDb
    ) -> None:
        # The Rails job that exhausted its retries and was dead-lettered.
        counted, _ = await storm(server_target, storm_db, "lock, no retry", seed=2)
        assert counted.lost > 0, counted
        assert (counted.duplicates, counted.processed_twice) == (0, 0), counted

    async def test_retry_aligned_with_the_ttl_neither_duplicates_nor_loses(
        self, server_target: Target, storm_db: StormDb
    ) -> None:
        counted, reports = await storm(server_target, storm_db, "lock + retry", seed=3)
        assert counted.overran == 0, f"a holder outlived its {STORM_TTL} s TTL: {counted}"
        assert counted.conversations == CONTACTS, counted
        assert (counted.duplicates, counted.lost, counted.processed_twice) == (0, 0, 0), counted
        assert counted.stranded == 0, counted
        stats = total_statistics(reports)
        assert stats["calls"] == CONTACTS * PER_CONTACT
        # the retries and the fallback really ran (the storm is dense enough for both)
        assert stats["retries"] > 0, stats
        assert stats["processed_without_lock"] > 0, stats
        assert stats["processed_without_lock"] == stats["exhausted"], stats
        assert stats["dropped"] == 0, stats


async def slow_holder_storm(
    target: Target, db: StormDb, wait: tuple[str, float]
) -> tuple[StormTally, list[dict[str, Any]]]:
    """One process holds every contact's lock SLOW_HOLD s between find and create; two more
    processes deliver their messages for the same contacts once the holder is inside."""
    messages = storm_messages(SLOW_CONTACTS, 1 + SLOW_PER_PROCESS * (PROCESSES - 1), seed=4)
    firsts = [m for m in messages if m.id < SLOW_CONTACTS]  # one per contact
    rest = [m for m in messages if m.id >= SLOW_CONTACTS]
    hands: list[list[tuple[int, int]]] = [[] for _ in range(PROCESSES - 1)]
    for n, message in enumerate(rest):
        hands[n % len(hands)].append((message.id, message.contact))
    settings = {"ttl": SLOW_TTL, "gap": GAP, "wait": wait, "attempts": 3, "jitter": 0.15}
    go = multiprocessing.get_context("spawn").Event()
    holder = (
        _storm_workers.holder_worker,
        (
            target.url,
            target.options,
            db.url,
            db.prefix,
            [(m.id, m.contact) for m in firsts],
            SLOW_TTL,
            SLOW_HOLD,
            go,
        ),
    )
    others = [
        (
            _storm_workers.storm_worker,
            (target.url, target.options, db.url, db.prefix, "lock + retry", hand, settings, go),
        )
        for hand in hands
    ]
    reports = await run_processes([holder, *others])
    held = next(r["held"] for r in reports if "held" in r)
    assert max(held) < SLOW_TTL, f"the holder overran its TTL ({held}); premise broken"
    conversations = _storm_workers.RedisConversations(db.client, db.prefix)
    overran = sum(r.get("overran", 0) for r in reports)
    counted = await tally(conversations, messages, "slow", overran=overran)
    if target.backend.name in REDIS_BACKENDS:
        await check_lock_homes(target, range(SLOW_CONTACTS), overran=overran)
    return counted, reports


class TestRetryWindowAgainstASlowHolder:
    async def test_a_window_shorter_than_the_ttl_reopens_the_race(
        self, server_target: Target, storm_db: StormDb
    ) -> None:
        # The decorator would have refused this configuration had it been told the TTL.
        with pytest.raises(ValueError, match="too short"):
            retry_on_lock_conflict(wait=SHORT_WAIT, attempts=3, lock_ttl=SLOW_TTL)
        counted, reports = await slow_holder_storm(server_target, storm_db, ("fixed", SHORT_WAIT))
        # The fallbacks ran at ~0.2 s, while the holder was still between find and create.
        assert counted.duplicates > 0, counted
        assert (counted.lost, counted.processed_twice) == (0, 0), counted
        assert total_statistics(reports)["processed_without_lock"] > 0

    async def test_a_window_lined_up_with_the_ttl_waits_the_holder_out(
        self, server_target: Target, storm_db: StormDb
    ) -> None:
        retry_on_lock_conflict(wait=lambda n: ALIGNED_STEP * n, attempts=3, lock_ttl=SLOW_TTL)
        counted, _ = await slow_holder_storm(server_target, storm_db, ("linear", ALIGNED_STEP))
        assert counted.overran == 0, counted
        assert counted.conversations == SLOW_CONTACTS, counted
        assert (counted.duplicates, counted.lost, counted.processed_twice) == (0, 0, 0), counted
