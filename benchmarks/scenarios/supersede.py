"""Scenario ``supersede``: how soon a newer event reaches a handler running in another process.

Per backend, the holder (a spawned process; in-process for memory) runs a handler waiting for
``ctx.superseded``; the latency is from the newer event's dispatch to the flag being set there,
beside the usual 250 ms poll of a flag. Bounded: ``SAMPLES`` per backend and mode.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import time
import traceback
from typing import TYPE_CHECKING, Any

from benchmarks.harness.env import KEY_ROOT, log, now_utc
from benchmarks.harness.report import Section
from benchmarks.harness.scenario import Scenario
from benchmarks.harness.sql_server import MYSQL_URL, PG_URL
from benchmarks.harness.stats import percentile

if TYPE_CHECKING:
    from collections.abc import Callable

    from benchmarks.harness.env import Asynclock, Config

SAMPLES = 40
QUICK_SAMPLES = 10
POLL_EVERY = 0.25
MODES = ("push", "poll")


async def _hold(
    module: Any, state: Any, mode: str, samples: int, send: Callable[[Any], None]
) -> None:
    """The holder's side: one dispatch per sample, whose handler waits to be superseded."""
    bot = module.EventDispatcher(
        state, on_lock_conflict="supersede", supersede_grace=None, lock_ttl=30.0
    )

    async def handler(event: Any, ctx: Any) -> None:
        n = int(event.thread_id)
        send(("inside", n))
        if mode == "push":
            await ctx.superseded.wait()
        else:
            # the workaround measured on purpose: a flag read every 250 ms
            while await state.dedupe_remaining(f"flag:{n}") is None:  # noqa: ASYNC110
                await asyncio.sleep(POLL_EVERY)
        send(("flagged", n, time.time()))

    bot.add_handler("message", handler)
    try:
        for n in range(samples):
            await bot.dispatch(module.Event("message", "bench", mode, str(n), f"old-{n}"))
    finally:
        await bot.aclose()


async def _hold_alone(url: str, prefix: str, mode: str, samples: int, out: Any) -> None:
    import asynclock

    state = asynclock.state_from_url(url, prefix=prefix)
    try:
        await _hold(asynclock, state, mode, samples, out.put)
    finally:
        await state.aclose()


def _holder_main(url: str, prefix: str, mode: str, samples: int, out: Any) -> None:
    """Entry point of the spawned holder."""
    try:
        asyncio.run(_hold_alone(url, prefix, mode, samples, out))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("error", traceback.format_exc()))


async def _measure(api: Asynclock, url: str, mode: str, samples: int) -> list[float]:
    """Latencies (seconds) of one backend and mode."""
    module = api.module
    prefix = f"{KEY_ROOT}:supersede:{os.getpid()}:{time.monotonic_ns()}:"
    local = url.startswith("memory://")
    state = module.MemoryState() if local else module.state_from_url(url, prefix=prefix)
    newer = module.EventDispatcher(state, on_lock_conflict="supersede", lock_ttl=30.0)
    newer.add_handler("message", lambda event: None)
    queue: Any
    holder: Any
    if local:
        queue = asyncio.Queue()
        holder = asyncio.ensure_future(_hold(module, state, mode, samples, queue.put_nowait))
    else:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        holder = ctx.Process(
            target=_holder_main, args=(url, prefix, mode, samples, queue), daemon=True
        )
        holder.start()

    async def receive() -> Any:
        if local:
            return await asyncio.wait_for(queue.get(), 60.0)
        message = await asyncio.to_thread(queue.get, True, 60.0)
        if message[0] == "error":
            raise RuntimeError(message[1])
        return message

    latencies: list[float] = []
    try:
        for n in range(samples):
            assert (await receive()) == ("inside", n)
            # the newer event comes at a random moment of the handler's run (as for a poller's
            # phase); the first sample warms the connections (LISTEN, the ear) and is not kept
            await asyncio.sleep(random.uniform(0.0, POLL_EVERY))
            sent = time.time()
            if mode == "push":
                event = module.Event("message", "bench", mode, str(n), f"new-{n}")
                dispatched = asyncio.ensure_future(newer.dispatch(event))
            else:
                await state.dedupe_add(f"flag:{n}", 60.0)
                dispatched = None
            kind, got, flagged = await receive()
            assert (kind, got) == ("flagged", n)
            if n:
                latencies.append(flagged - sent)
            if dispatched is not None:
                await dispatched
    finally:
        await newer.aclose()
        if local:
            await holder
        else:
            await asyncio.to_thread(holder.join, 30.0)
            if holder.is_alive():
                holder.kill()
        await state.aclose()
    return latencies


async def run(cfg: Config, api: Asynclock | str) -> Section:
    if isinstance(api, str):
        return Section("supersede", f"skipped: {api}\n")
    samples = (QUICK_SAMPLES if cfg.quick else SAMPLES) + 1  # the first one warms up
    backends = (
        ("memory (same process)", "memory://"),
        ("Redis", cfg.url),
        ("PostgreSQL", PG_URL),
        ("MariaDB", MYSQL_URL),
    )
    started = now_utc()
    rows: list[str] = []
    headlines: list[tuple[str, str]] = []
    for name, url in backends:
        cells = []
        for mode in MODES:
            try:
                values = await _measure(api, url, mode, samples)
            except Exception as exc:  # noqa: BLE001 - one backend down skips its row
                log(f"supersede: {name} {mode} failed: {exc!r}")
                cells.append("failed")
                continue
            p50, p99 = percentile(values, 50) * 1000, percentile(values, 99) * 1000
            cells.append(f"{p50:.1f} / {p99:.1f}")
            if mode == "push":
                headlines.append((f"supersede {name} p50/p99 ms", f"{p50:.1f} / {p99:.1f}"))
            log(f"supersede: {name} {mode}: p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        rows.append(f"| {name} | {cells[0]} | {cells[1]} |")
    body = (
        "## Supersede: from a newer event to `ctx.superseded` in the holder's process\n\n"
        "Time from the newer event's `dispatch()` call to `ctx.superseded` being set in the "
        "handler that runs in *another* process (memory: the same process), milliseconds, "
        f"p50 / p99 over {samples - 1} samples per cell (after one to warm up), a key per "
        "sample, the newer event sent at a random moment of the handler's run. `supersede` is the "
        "state's push (Redis pub/sub, PostgreSQL `NOTIFY`, MariaDB's ear interrupted by "
        "`KILL QUERY`); the newer side's first attempt at the lock, then `inspect` and the "
        "signal, are in the time. `poll 250 ms` is the usual workaround in the same run: the "
        "newer side writes a flag through the same state and the handler reads it every "
        f"250 ms. Run of {started}.\n\n"
        "| backend | supersede (push) | poll 250 ms |\n|---|---|---|\n" + "\n".join(rows) + "\n"
    )
    return Section("supersede", body, headlines)


SCENARIO = Scenario("supersede", run, own_environment=True)
