"""Scenario ``inbox-growth``: nothing of a handled event stays in the state, and a worker's
memory stays flat (#30).

Per server backend (Redis, Redis Cluster, PostgreSQL, MariaDB; ``ASYNCLOCK_GROWTH_BACKENDS``
picks some, e.g. ``redis,postgres``) and per run (``default``: ``dedupe_ttl`` 600 s and the
states' defaults; ``short``: ``dedupe_ttl`` 10 s, ``token_retention`` 5 s and, on SQL,
``purge_interval`` 5 s), this process accepts ``EVENTS`` events (100,000; 10,000 with
``--quick``) while a worker process runs ``serve()`` on them. The events go to ``LANES`` keys at
a time, ``PER_KEY`` events each, then the lanes move on to new keys (10,000 distinct keys over a
full run, as conversations come and go), and the producer keeps at most ``WINDOW`` events
accepted but not yet handled.

It counts what the state holds under the run's prefix: Redis keys by kind (a ``SCAN`` of the
prefix, every master of a cluster), SQL rows of every table (``locks``, ``dedupe``,
``inboxes``, ``inbox_entries`` of the prefix's inboxes, and entries of no inbox at all, any
prefix's). Counts are taken before, at half way, right after the last event was handled, and
then every second until only the dedupe records still inside ``dedupe_ttl`` are left (or, in
the short run, nothing), within a bound. The worker's RSS (``/proc/PID/status``, read from this
process) is sampled every ``RSS_EVERY`` handled events from ``RSS_FROM`` on.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from benchmarks.harness.env import log
from benchmarks.harness.report import Section, kv_table
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.servers import configured_url
from benchmarks.harness.sql_server import MYSQL_URL, PG_URL, key_id, mysql_connect, pg_connect

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized
    from multiprocessing.synchronize import Event as MpEvent

    from benchmarks.harness.env import Asynclock, Config

LANES = 50
PER_KEY = 10
WINDOW = 2_000
#: a dedupe record of the default run outlives the whole run; of the short run, it goes
DEFAULT_DEDUPE_TTL = 600.0
SHORT = {"dedupe_ttl": 10.0, "token_retention": 5.0, "purge_interval": 5.0}
LABEL = {
    "redis": "Redis",
    "redis-cluster": "Redis Cluster",
    "postgres": "PostgreSQL",
    "mysql": "MariaDB",
}


def _sizes(quick: bool) -> tuple[int, int, int]:
    """Events, the first handled count whose RSS is sampled, and the sampling step."""
    return (10_000, 2_000, 1_000) if quick else (100_000, 10_000, 5_000)


def _urls(cfg: Config) -> dict[str, str]:
    return {
        "redis": cfg.url,
        "redis-cluster": configured_url(),
        "postgres": PG_URL,
        "mysql": MYSQL_URL,
    }


def _event(api: Asynclock, i: int) -> Any:
    lane, generation = i % LANES, i // (LANES * PER_KEY)
    return api.module.Event("message", "growth", f"C{lane}", f"T{generation}", f"m{i}")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) / 1024
    return float("nan")


# -- the worker process ---------------------------------------------------------------------


def _worker(
    url: str,
    prefix: str,
    state_options: dict[str, Any],
    dedupe_ttl: float,
    handled: Synchronized[int],
    ready: MpEvent,
    stop: MpEvent,
) -> None:
    asyncio.run(_serve(url, prefix, state_options, dedupe_ttl, handled, ready, stop))


async def _serve(
    url: str,
    prefix: str,
    state_options: dict[str, Any],
    dedupe_ttl: float,
    handled: Synchronized[int],
    ready: MpEvent,
    stop: MpEvent,
) -> None:
    import asynclock

    state = asynclock.state_from_url(url, prefix=prefix, **state_options)
    bot = asynclock.EventDispatcher(state, on_lock_conflict="queue", dedupe_ttl=dedupe_ttl)

    @bot.on("message")
    async def count(event: Any, ctx: Any) -> None:
        handled.value += 1  # this process alone writes it

    task = asyncio.ensure_future(bot.serve())
    ready.set()
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, stop.wait)
    await bot.aclose()
    await task
    await state.aclose()


# -- counting what the state holds -----------------------------------------------------------


def _redis_kind(name: str, prefix: str) -> str:
    """The kind of a key of the run: the suffix after the hash tag, ``event:`` for claims."""
    rest = name[len(prefix) :]
    if rest.startswith("event:"):
        return "dedupe claim (event:...)"
    if not rest.startswith("{"):
        return rest  # the ready set of one server (inbox:ready)
    tail = rest[rest.index("}") + 1 :]
    if tail.startswith(":abandoned:"):
        return "abandon mark"
    if tail in (":inbox:ready", ":inbox:listed", ":inbox:slots"):
        return f"slot {tail[1:]}"
    return f"{{key}}{tail}" if tail else "lock (token kept after release)"


async def _redis_nodes(backend: str, url: str) -> list[Any]:
    from redis.asyncio import Redis, RedisCluster

    if backend == "redis":
        return [Redis.from_url(url)]
    first = urlsplit(url).netloc.rpartition("@")[2].split(",")[0]
    cluster = RedisCluster.from_url(f"redis://{first}")
    try:
        await cluster.initialize()
        return [Redis(host=n.host, port=int(n.port)) for n in cluster.get_primaries()]
    finally:
        await cluster.aclose()


async def _count_redis(nodes: list[Any], prefix: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        async for raw in node.scan_iter(match=prefix.replace("*", r"\*") + "*", count=2000):
            kind = _redis_kind(raw.decode(), prefix)
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "slot inbox:slots":  # the cluster's directory: its entries are slots
                listed = int(await node.hlen(raw))
                counts["slots listed in the directory"] = (
                    counts.get("slots listed in the directory", 0) + listed
                )
    return counts


_TABLES = ("locks", "dedupe", "inboxes")
_ENTRIES = (
    "SELECT count(*) FROM asynclock_inbox_entries WHERE inbox IN "
    "(SELECT id FROM asynclock_inboxes WHERE name LIKE {})"
)
#: entries whose inboxes row is gone, of any prefix, by inbox (the run's are told apart by id:
#: other users of the tables may leave theirs, e.g. a test purged while its worker still ran)
_ORPHANS = (
    "SELECT inbox, count(*) FROM asynclock_inbox_entries AS e WHERE NOT EXISTS "
    "(SELECT 1 FROM asynclock_inboxes AS i WHERE i.id = e.inbox) GROUP BY inbox"
)


async def _orphans(backend: str, conn: Any, ours: set[bytes]) -> int:
    if backend == "postgres":
        rows = await conn.fetch(_ORPHANS)
    else:
        async with conn.cursor() as cursor:
            await cursor.execute(_ORPHANS)
            rows = await cursor.fetchall()
    return sum(int(n) for inbox, n in rows if bytes(inbox) in ours)


async def _count_sql(backend: str, conn: Any, prefix: str, ours: set[bytes]) -> dict[str, int]:
    pattern = prefix + "%"
    statements = [
        (f"asynclock_{table}", f"SELECT count(*) FROM asynclock_{table} WHERE name LIKE {{}}")
        for table in _TABLES
    ]
    statements.append(("asynclock_inbox_entries", _ENTRIES))
    counts: dict[str, int] = {}
    for name, statement in statements:
        args = [pattern] if "{}" in statement else []
        if backend == "postgres":
            text = statement.format(*(f"${n + 1}" for n in range(len(args))))
            value = await conn.fetchval(text, *args)
        else:
            async with conn.cursor() as cursor:
                await cursor.execute(statement.format(*("%s" for _ in args)), args)
                value = (await cursor.fetchone())[0]
        if value:
            counts[name] = int(value)
    orphans = await _orphans(backend, conn, ours)
    if orphans:
        counts["asynclock_inbox_entries of no inboxes row"] = orphans
    return counts


@dataclass
class Counter:
    """Counts a run's keys or rows, on connections of its own (not the states')."""

    backend: str
    url: str
    prefix: str
    #: SQL: the ids of the run's inboxes (SHA-256 of the prefixed key, as the states make them)
    ours: set[bytes] = field(default_factory=set)
    handles: list[Any] = field(default_factory=list)

    async def open(self) -> None:
        if self.backend.startswith("redis"):
            self.handles = await _redis_nodes(self.backend, self.url)
        elif self.backend == "postgres":
            self.handles = [await pg_connect(self.url, synchronous_commit=None)]
        else:
            self.handles = [await mysql_connect(self.url)]
            async with self.handles[0].cursor() as cursor:
                await cursor.execute("SET SESSION autocommit = 1")

    async def count(self) -> dict[str, int]:
        if self.backend.startswith("redis"):
            return await _count_redis(self.handles, self.prefix)
        return await _count_sql(self.backend, self.handles[0], self.prefix, self.ours)

    async def delete(self, prefix: str) -> None:
        """Delete every row of ``prefix`` (SQL: the probe's, whose events nobody handles)."""
        statements = [
            _ENTRIES.replace("SELECT count(*)", "DELETE"),
            *(f"DELETE FROM asynclock_{table} WHERE name LIKE {{}}" for table in _TABLES),
        ]
        for statement in statements:
            if self.backend == "postgres":
                await self.handles[0].execute(statement.format("$1"), prefix + "%")
            else:
                async with self.handles[0].cursor() as cursor:
                    await cursor.execute(statement.format("%s"), [prefix + "%"])

    async def aclose(self) -> None:
        for handle in self.handles:
            if self.backend.startswith("redis"):
                await handle.aclose()
            elif self.backend == "postgres":
                await handle.close()
            else:
                handle.close()


def _fmt(counts: dict[str, int]) -> str:
    if not counts:
        return "nothing"
    return ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items()))


def _only_dedupe(counts: dict[str, int]) -> bool:
    return all("dedupe" in kind for kind in counts)


# -- one run ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    backend: str
    run: str
    events: int
    seconds: float = 0.0
    counts: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    rss: list[tuple[int, float]] = field(default_factory=list)
    settled: str = ""

    def rss_summary(self) -> str:
        if not self.rss:
            return "no samples"
        values = [mib for _, mib in self.rss]
        first, last = self.rss[0], self.rss[-1]
        step = max(1, len(self.rss) // 10)
        series = " ".join(f"{mib:.1f}" for _, mib in self.rss[::step])
        return (
            f"{first[1]:.1f} MiB at {first[0]:,} -> {last[1]:.1f} MiB at {last[0]:,} "
            f"(min {min(values):.1f}, max {max(values):.1f}, spread {max(values) - min(values):.1f}; "
            f"slope {_slope(self.rss) * 10_000:+.2f} MiB per 10,000 events; samples {series})"
        )


def _slope(points: list[tuple[int, float]]) -> float:
    """Least-squares MiB per handled event over ``points`` (handled, MiB)."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0


async def _run(api: Asynclock, cfg: Config, backend: str, run: str) -> Outcome:
    url = _urls(cfg)[backend]
    events, rss_from, rss_every = _sizes(cfg.quick)
    tag = secrets.token_hex(4)
    prefix = f"bench-growth-{tag}-{run}:"
    short = run == "short"
    dedupe_ttl = SHORT["dedupe_ttl"] if short else DEFAULT_DEDUPE_TTL
    options: dict[str, Any] = {}
    if short:
        options["token_retention"] = SHORT["token_retention"]
        if not backend.startswith("redis"):
            options["purge_interval"] = SHORT["purge_interval"]
    out = Outcome(backend, run, events)
    keys = {_event(api, i).thread_key for i in range(events)}
    counter = Counter(backend, url, prefix, {key_id(prefix + key) for key in keys})
    await counter.open()
    ctx = multiprocessing.get_context("spawn")
    handled = ctx.Value("q", 0, lock=False)
    ready, stop = ctx.Event(), ctx.Event()
    worker = ctx.Process(
        target=_worker,
        args=(url, prefix, options, dedupe_ttl, handled, ready, stop),
        name=f"growth-worker-{backend}",
    )
    worker.start()
    state = api.module.state_from_url(url, prefix=prefix, **options)
    try:
        if not await asyncio.get_running_loop().run_in_executor(None, ready.wait, 60.0):
            raise RuntimeError("the worker did not start")
        bot = api.module.EventDispatcher(state, on_lock_conflict="queue", dedupe_ttl=dedupe_ttl)
        out.counts.append(("before", await counter.count()))
        next_rss = rss_from
        t0 = time.monotonic()
        sent = 0
        halfway = False

        def sample() -> None:
            nonlocal next_rss
            while handled.value >= next_rss and next_rss <= events:
                out.rss.append((next_rss, rss_mib(worker.pid or 0)))
                next_rss += rss_every

        while sent < events:
            if not worker.is_alive():
                raise RuntimeError(f"the worker died (exit code {worker.exitcode})")
            room = min(WINDOW - (sent - handled.value), events - sent, 50)
            if room <= 0:
                sample()
                await asyncio.sleep(0.002)
                continue
            outcomes = await asyncio.gather(
                *(bot.accept(_event(api, i)) for i in range(sent, sent + room))
            )
            if any(o != "accepted" for o in outcomes):
                raise RuntimeError(f"an accept was not accepted: {set(outcomes)}")
            sent += room
            sample()
            if not halfway and sent >= events // 2:
                halfway = True
                out.counts.append((f"half way ({sent:,} accepted)", await counter.count()))
        deadline = time.monotonic() + 600.0
        while handled.value < events:
            if time.monotonic() > deadline or not worker.is_alive():
                raise RuntimeError(f"handled {handled.value} of {events}")
            sample()
            await asyncio.sleep(0.01)
        sample()
        out.seconds = time.monotonic() - t0
        out.counts.append(("right after the last handling", await counter.count()))
        await _settle(out, counter, api, dedupe_ttl)
    finally:
        stop.set()
        await state.aclose()
        await asyncio.get_running_loop().run_in_executor(None, worker.join, 60.0)
        if worker.is_alive():
            worker.kill()
        await counter.aclose()
    return out


async def _settle(out: Outcome, counter: Counter, api: Asynclock, dedupe_ttl: float) -> None:
    """Count every second until the state holds only dedupe records (the default run) or
    nothing (the short run), within a bound; the worker keeps serving meanwhile.

    The SQL states delete expired rows on activity (a purge at most every ``purge_interval``,
    started by an accept, an acquire or a dedupe check of any state on the same tables, whatever
    its prefix); an idle worker's rescans purge nothing. So on SQL one accept a second goes to a
    state of another prefix meanwhile (``purge_interval`` 1 s), as a live deployment's traffic
    would.
    """
    short = out.run == "short"
    started = time.monotonic()
    bound = (dedupe_ttl if short else 70.0) + 90.0
    probe_state = None
    probe_bot = None
    if not out.backend.startswith("redis"):
        probe_state = api.module.state_from_url(
            counter.url, prefix=f"{counter.prefix[:-1]}-probe:", purge_interval=1.0
        )
        probe_bot = api.module.EventDispatcher(probe_state, dedupe_ttl=1.0)
    try:
        n = 0
        while True:
            counts = await counter.count()
            waited = time.monotonic() - started
            if (not counts) if short else _only_dedupe(counts):
                out.counts.append((f"{waited:.0f} s later", counts))
                out.settled = f"{waited:.0f} s after the last handling"
                return
            if waited > bound:
                out.counts.append((f"{waited:.0f} s later (bound reached)", counts))
                out.settled = f"not within {bound:.0f} s"
                return
            if probe_bot is not None:
                event = api.module.Event("message", "probe", "P", "P", f"p{n}")
                await probe_bot.accept(event)
                n += 1
            await asyncio.sleep(1.0)
    finally:
        if probe_state is not None:
            await probe_state.aclose()
            await counter.delete(f"{counter.prefix[:-1]}-probe:")  # nobody drains those


# -- the scenario ----------------------------------------------------------------------------


def _backends() -> list[str]:
    chosen = os.environ.get("ASYNCLOCK_GROWTH_BACKENDS", "")
    names = [b.strip() for b in chosen.split(",") if b.strip()] or list(LABEL)
    unknown = [b for b in names if b not in LABEL]
    if unknown:
        raise ValueError(f"ASYNCLOCK_GROWTH_BACKENDS: unknown {unknown}, known {list(LABEL)}")
    return names


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    return url.replace(f":{unquote(parts.password)}@", ":***@") if parts.password else url


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("inbox-growth", f"skipped: {api}\n")
    rows: list[tuple[str, str]] = []
    for backend in _backends():
        for which in ("default", "short"):
            log(f"inbox-growth: {backend}, {which} run")
            try:
                out = await _run(api, cfg, backend, which)
            except Exception as exc:  # noqa: BLE001 (reported, never fatal)
                rows.append((f"{LABEL[backend]}, {which}", f"failed: {exc!r}"))
                log(f"inbox-growth: {backend} {which} failed: {exc!r}")
                continue
            label = f"{LABEL[backend]}, {which}"
            rate = out.events / out.seconds if out.seconds else 0.0
            rows.append(
                (f"{label}: events, time", f"{out.events:,} in {out.seconds:.0f} s ({rate:,.0f}/s)")
            )
            for when, counts in out.counts:
                rows.append((f"{label}: {when}", _fmt(counts)))
            rows.append((f"{label}: settled", out.settled))
            rows.append((f"{label}: worker RSS", out.rss_summary()))
            log(f"inbox-growth: {label}: {out.rss_summary()}; settled {out.settled}")
    servers = ", ".join(f"{LABEL[b]} {_redacted(_urls(cfg)[b])}" for b in _backends())
    body = (
        f"Events accepted and handled by one `serve()` worker process ({LANES} keys at a time, "
        f"{PER_KEY} events per key, at most {WINDOW:,} waiting), then what the state holds "
        f"under the run's prefix, and the worker's RSS. Runs: `default` (dedupe_ttl "
        f"{DEFAULT_DEDUPE_TTL:.0f} s, the states' defaults), `short` (dedupe_ttl "
        f"{SHORT['dedupe_ttl']:.0f} s, token_retention {SHORT['token_retention']:.0f} s, SQL "
        f"purge_interval {SHORT['purge_interval']:.0f} s). Servers: {servers}.\n\n"
        + kv_table(rows)
        + "\n"
    )
    return Section("inbox-growth", body)


SCENARIO = Scenario("inbox-growth", run, redis=False, in_all=False, own_environment=True)
