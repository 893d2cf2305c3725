"""Scenario ``held``: the cost of a pair while the same task holds 10,000 other locks (#16).

How the timings alternate and why the fastest chunk is the headline: docs/benchmarks.md, the
``held`` block (as ``tests/unit/test_lock_scaling.py`` and the conformance test time it).
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio

from benchmarks.harness import progress as _progress
from benchmarks.harness.env import (
    KEY_ROOT,
    Asynclock,
    Config,
    background_rate,
    general_facts,
    log,
    now_utc,
    short,
)
from benchmarks.harness.report import (
    Column,
    Headlines,
    Metrics,
    Rounds,
    Section,
    kept,
    kv_table,
    table,
)
from benchmarks.harness.rounds import rotated
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.servers import SETTINGS, cluster_url, delete_cluster_keys, masters
from benchmarks.harness.sql_server import MYSQL_URL, PG_URL, cleanup
from benchmarks.harness.states import open_state
from benchmarks.harness.stats import fmt

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    #: ``(key, ttl)`` -> a new lock object with awaitable ``acquire()`` and ``release()``
    NewLock = Callable[[str, float], Any]

HELD = 10_000
PAIR_KEYS = 16
#: the held locks must outlive a round (take, every timing, give) on a loaded machine
HELD_TTL = 180.0
PAIR_TTL = 30.0
WARMUP = 50
#: each timing is this many chunks of pairs (see ``Holder.timed``)
CHUNKS = 5
#: ratios above this miss #16's target (the tests' bound is a looser 2.0x)
TARGET = 1.2

MEMORY = "**asynclock** AsyncLock (MemoryState)"
REDIS = "**asynclock** AsyncLock (RedisState)"
CLUSTER = "**asynclock** AsyncLock (RedisState, Redis Cluster of 3 masters)"
POSTGRES = "**asynclock** AsyncLock (PostgresState)"
MYSQL = "**asynclock** AsyncLock (MySQLState, MariaDB)"
REDISPY = "redis-py asyncio Lock (`r.lock`, the same Redis server)"
#: asynclock's rows and the backend each is graded for in the targets table
ASYNCLOCK_ROWS = (
    (MEMORY, "MemoryState"),
    (REDIS, "RedisState"),
    (CLUSTER, "RedisState on Redis Cluster"),
    (POSTGRES, "PostgresState"),
    (MYSQL, "MySQLState (MariaDB)"),
)


class Holder:
    """One backend's row: how to make its locks, how many pairs a chunk has, how to close it.

    Every method runs in the caller's task, so the pairs are timed in the task that holds the
    locks (asynclock keeps its bookkeeping per task).
    """

    def __init__(
        self,
        name: str,
        new_lock: NewLock,
        pairs: int,
        close: Callable[[], Awaitable[None]],
        prefix: str = "",
    ) -> None:
        self.name, self.new_lock, self.pairs, self.close = name, new_lock, pairs, close
        self.held_keys = [f"{prefix}held-{n}" for n in range(HELD)]
        self.pair_keys = [f"{prefix}pair-{n}" for n in range(PAIR_KEYS)]
        self.held: list[Any] = []

    async def take(self) -> float:
        """Acquire the ``HELD`` locks; the seconds it took."""
        new, t0 = self.new_lock, time.perf_counter()
        for key in self.held_keys:
            lock = new(key, HELD_TTL)
            if not await lock.acquire():
                raise RuntimeError(f"{key!r} refused while taking the {HELD:,} locks")
            self.held.append(lock)
        return time.perf_counter() - t0

    async def give(self) -> float:
        """Release every held lock; the seconds it took."""
        t0 = time.perf_counter()
        while self.held:
            await self.held.pop().release()
        return time.perf_counter() - t0

    async def warm(self) -> None:
        """Connections, scripts, schema and code paths, before anything is timed."""
        await self._pairs(WARMUP)

    async def timed(self) -> tuple[float, float]:
        """µs per pair: the fastest of ``CHUNKS`` chunks and the mean over all of them."""
        gc.collect()
        gc.disable()
        try:
            chunks = [await self._pairs(self.pairs) for _ in range(CHUNKS)]
        finally:
            gc.enable()
        return min(chunks), sum(chunks) / CHUNKS

    async def _pairs(self, n: int) -> float:
        new, keys, misses = self.new_lock, self.pair_keys, 0
        t0 = time.perf_counter()
        for i in range(n):
            lock = new(keys[i % PAIR_KEYS], PAIR_TTL)
            if not await lock.acquire():
                misses += 1
            await lock.release()
        wall = time.perf_counter() - t0
        if misses:
            raise RuntimeError(f"{misses} of {n} uncontended acquires refused")
        return wall / n * 1e6

    async def cycle(self) -> Metrics:
        """One round: take the locks, time the pairs held, give the locks back, time alone.

        Both timings follow a burst of ``HELD`` round trips of the same backend (the acquires,
        the releases): a timing that followed other work instead (another backend's, or
        nothing) would run in another state of the machine (a loopback round trip after a
        burst of them was measured at ~2x one after the SQL rows' slower traffic).
        """
        take_s = await self.take()
        held, held_all = await self.timed()
        give_s = await self.give()
        alone, alone_all = await self.timed()
        return {
            "us_alone": alone,
            "us_held": held,
            "ratio": held / alone,
            "ratio_all": held_all / alone_all,
            "take_s": take_s,
            "give_s": give_s,
        }

    async def stop(self) -> None:
        """Give back what is still held (after a failure) and close the client."""
        try:
            await self.give()
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            log(f"held: {_tag(self.name)}: giving the locks back failed: {exc!r}")
        try:
            await self.close()
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            log(f"held: {_tag(self.name)}: close failed: {exc!r}")


def _asynclock(api: Asynclock, name: str, state: Any, pairs: int) -> Holder:
    lock_cls = api.lock_factory()

    def new(key: str, ttl: float) -> Any:
        return lock_cls(state, key, ttl=ttl)

    return Holder(name, new, pairs, state.aclose)


def _redispy(cfg: Config, pairs: int) -> Holder:
    client = redis.asyncio.Redis.from_url(cfg.url)

    def new(key: str, ttl: float) -> Any:
        return client.lock(key, timeout=ttl)

    return Holder(REDISPY, new, pairs, client.aclose, prefix=cfg.key("held", "redis-py") + ":")


async def _clean_cluster(url: str, run_id: str) -> None:
    """Delete the keys the locks leave on a shared cluster (they would expire in a minute)."""
    try:
        clients = await masters(url)
        try:
            deleted = await delete_cluster_keys(clients, run_id)
        finally:
            for client in clients:
                await client.aclose()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        log(f"held: cleaning the cluster failed: {exc!r}")
        return
    log(f"held: deleted {deleted} key(s) of run {run_id} from the cluster")


def _pairs_per_chunk(cfg: Config) -> tuple[int, int, int]:
    """Pairs per chunk on MemoryState, on Redis (single, cluster, redis-py) and on SQL."""
    return (400, 40, 20) if cfg.quick else (1_000, 100, 60)


def _holders(cfg: Config, api: Asynclock, prefix: str, cluster: str | None) -> list[Holder]:
    memory, redis_n, sql = _pairs_per_chunk(cfg)
    urls = [(REDIS, "redis", cfg.url, redis_n), (POSTGRES, "postgres", PG_URL, sql)]
    urls.append((MYSQL, "mysql", MYSQL_URL, sql))
    if cluster is not None:
        urls.insert(1, (CLUSTER, "redis", cluster, redis_n))
    holders = [_asynclock(api, MEMORY, api.memory_state(), memory)]
    for name, backend, url, pairs in urls:
        holders.append(_asynclock(api, name, open_state(api, backend, url, prefix), pairs))
    holders.append(_redispy(cfg, redis_n))
    return holders


def _tag(name: str) -> str:
    """A row's backend, for progress lines."""
    return dict(ASYNCLOCK_ROWS).get(name, short(name))


async def _drop(
    holder: Holder, live: list[Holder], rounds: Rounds, what: str, exc: Exception
) -> None:
    reason = f"{what}: {type(exc).__name__}: {exc}".splitlines()[0]
    rounds.skip(holder.name, reason)
    log(f"held: {_tag(holder.name)} dropped ({reason})")
    live.remove(holder)  # a row that failed once is not run again
    await holder.stop()


async def _round(live: list[Holder], rounds: Rounds, r: int) -> None:
    parts = []
    for holder in rotated(live, r):
        try:
            m = await holder.cycle()
        except Exception as exc:  # noqa: BLE001 (the row is dropped, the run goes on)
            await _drop(holder, live, rounds, f"round {r + 1}", exc)
            continue
        rounds.add(holder.name, m)
        parts.append(f"{_tag(holder.name)}: {m['us_alone']:,.0f} -> {m['us_held']:,.0f} µs")
    log(f"held round {r + 1}: {', '.join(parts)}")


async def run(cfg: Config, api: Asynclock | str) -> Section:
    rounds_n = cfg.rounds_or(5, 1)
    rounds = Rounds()
    for name, _ in ASYNCLOCK_ROWS:
        rounds.declare(name)
    rounds.declare(REDISPY)
    started, t0, load = now_utc(), time.monotonic(), os.getloadavg()
    facts = await general_facts(cfg, api)
    monitor = redis.asyncio.Redis.from_url(cfg.url)
    try:  # the Redis server is shared: other clients' traffic moves the Redis rows
        others = f"{await background_rate(monitor):,.0f} commands/s"
    finally:
        await monitor.aclose()
    facts.append(("Redis server load from other clients before the run", others))
    prefix = f"{KEY_ROOT}:{cfg.run_id}:held:"  # every key and row of this run starts with it
    live: list[Holder] = []
    with contextlib.ExitStack() as stack:
        cluster, why = cluster_url(stack, "held")
        if cluster is None:
            rounds.skip(CLUSTER, why)
        facts.append(("Redis Cluster", cluster or f"skipped: {why}"))
        if isinstance(api, str):
            for name, _ in ASYNCLOCK_ROWS:
                rounds.skip(name, api)
            live = [_redispy(cfg, _pairs_per_chunk(cfg)[1])]
        else:
            live = _holders(cfg, api, prefix, cluster)
        try:
            for holder in list(live):
                try:
                    await holder.warm()
                except Exception as exc:  # noqa: BLE001, PERF203 (the row is dropped)
                    await _drop(holder, live, rounds, "warm-up", exc)
            with _progress.step("held rounds", rounds_n) as bar:
                for r in range(rounds_n):
                    if not live:
                        break
                    await _round(live, rounds, r)
                    bar.advance()
        finally:
            for holder in list(live):
                await holder.stop()
            log(f"held: deleted this run's rows: {await cleanup(prefix)}")
            if cluster is not None and not SETTINGS.private:
                await _clean_cluster(cluster, cfg.run_id)
    end_load = os.getloadavg()
    took = time.monotonic() - t0
    facts += [
        ("PostgreSQL", PG_URL),
        ("MariaDB", MYSQL_URL),
        (
            "load average (1, 5, 15 min)",
            f"{_load(load)} at the start, {_load(end_load)} at the end",
        ),
        ("run", f"{cfg.run_id}, {'quick' if cfg.quick else 'full'}, {took:.0f} s"),
    ]
    memory, redis_n, sql = _pairs_per_chunk(cfg)
    per_chunk = (
        f"{memory:,} (MemoryState), {redis_n:,} (Redis, Redis Cluster, redis-py), {sql:,} (SQL)"
    )
    facts.append(("pairs per timing", f"{CHUNKS} chunks of {per_chunk}"))
    return _section(rounds, rounds_n, facts, started)


def _load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{v:.2f}" for v in load)


def _section(rounds: Rounds, rounds_n: int, facts: list[tuple[str, str]], started: str) -> Section:
    columns = [
        Column("µs per pair alone", "us_alone", 1),
        Column(f"µs per pair with {HELD:,} held", "us_held", 1),
        Column("held ÷ alone", "ratio", 2),
        Column("held ÷ alone, every chunk (bursts of other load included)", "ratio_all", 2),
    ]
    body = [
        f"## Held: the cost of a pair while the task holds {HELD:,} other locks",
        "",
        kept("held-intro"),
        "",
        (
            f"{rounds_n} round{'s' if rounds_n > 1 else ''}; cells: median (min-max) over the "
            f"rounds, ratios taken within each round. Started {started}."
        ),
        "",
        kv_table(facts),
        "",
        table(rounds, columns),
        "",
        kept("held-rows"),
    ]
    headlines = Headlines()
    for name, backend in ASYNCLOCK_ROWS:
        alone = rounds.spread(name, "us_alone").median
        held = rounds.spread(name, "us_held").median
        note = f" ({fmt(alone, 1)} -> {fmt(held, 1)} µs per pair)"
        what = f"{backend}: pair with {HELD:,} held ÷ alone (target <= {TARGET}x)"
        headlines.metric(what, rounds, name, "ratio", 2, note=note)
    what = f"redis-py Lock (peer): pair with {HELD:,} held ÷ alone"
    headlines.metric(what, rounds, REDISPY, "ratio", 2, bold=False)
    return Section("held", "\n".join(body), headlines.rows)


SCENARIO = Scenario("held", run, own_environment=True)
