"""A Slack-like platform driving the shipped example apps in worker processes of their own (#14).

:func:`run_scenario` starts an example app as a deployment would (``uvicorn --workers N``, or
``N`` aiohttp processes sharing one port), configured only by environment variables, and sends
it bursts of events the way Slack does: every delivery not answered 2xx within
:data:`DEADLINE` seconds is retried, up to :data:`RETRIES` times, with ``X-Slack-Retry-Num`` and
``X-Slack-Retry-Reason``, after the ``Retry-After`` the answer asked for. It may ``kill -9`` one
worker mid-burst. The apps' handler appends every event it handled to a journal file (the
``ASYNCLOCK_EXAMPLE_JOURNAL`` setting), which outlives a killed worker, so the count that
matters can be made: **events answered 2xx but never handled**.

Run it by hand for bigger numbers (the issue's table)::

    python -m tests.integration._platform --kind fastapi --route sync --policy drop --kill
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests._matrix import REDIS, purge_namespace
from tests.support.ports import free_port
from tests.support.processes import start_group, stop_groups

if TYPE_CHECKING:
    import subprocess
    from collections.abc import AsyncIterator, Mapping

#: seconds Slack waits for a 2xx before it counts the delivery as failed
DEADLINE = 3.0
#: redeliveries Slack makes of an event after the first delivery failed
RETRIES = 3
#: seconds before a retry when the answer asked for none (Slack's own schedule, compressed)
DEFAULT_PAUSE = 1.0
#: seconds a started deployment may take to answer from every worker (a loaded machine)
STARTUP = 60.0
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Load:
    """The events of one run: ``threads`` conversations of ``messages`` each, sent in bursts."""

    threads: int = 10
    messages: int = 5
    #: seconds between two messages of one thread within its burst
    spacing: float = 0.02

    def payloads(self, run: str) -> list[tuple[str, dict[str, object]]]:
        """``(message id, Slack envelope)`` for every event; ``run`` keeps ids of runs apart."""
        events: list[tuple[str, dict[str, object]]] = []
        for t in range(self.threads):
            thread = f"{run}{t:03d}.0"
            for m in range(self.messages):
                ts = f"{run}{t:03d}.{m + 1:04d}"
                event: dict[str, object] = {
                    "type": "app_mention",
                    "channel": f"C{t % 3}",
                    "ts": ts,
                    "thread_ts": thread,
                    "text": "hi",
                }
                envelope: dict[str, object] = {
                    "type": "event_callback",
                    "event_id": f"Ev{run}{t}x{m}",
                }
                events.append((ts, {**envelope, "event": event}))
        return events


@dataclass
class Tally:
    """What the platform saw: per event, whether and at which try it was acknowledged."""

    acked: dict[str, int] = field(default_factory=dict)
    #: events never answered 2xx, even after the last retry
    given_up: set[str] = field(default_factory=set)
    statuses: Counter[str] = field(default_factory=Counter)
    deliveries: int = 0

    @property
    def retries_used(self) -> Counter[int]:
        """How many events were acknowledged after 0, 1, 2, 3 retries."""
        return Counter(self.acked.values())


async def deliver(
    client: httpx.AsyncClient, path: str, ts: str, payload: dict[str, object], tally: Tally
) -> None:
    """Deliver one event as Slack does, retrying until a 2xx or the retries run out."""
    headers: dict[str, str] = {}
    for attempt in range(RETRIES + 1):
        tally.deliveries += 1
        pause = DEFAULT_PAUSE
        try:
            answer = await client.post(path, json=payload, headers=headers, timeout=DEADLINE)
        except httpx.TimeoutException:
            tally.statuses["timeout"] += 1
            reason = "http_timeout"
        except httpx.TransportError:  # the worker died mid-request, say
            tally.statuses["connection lost"] += 1
            reason = "http_error"
        else:
            status = answer.status_code
            tally.statuses[str(status)] += 1
            if 200 <= status < 300:
                tally.acked[ts] = attempt
                return
            reason = "http_error"
            asked = answer.headers.get("Retry-After")
            if asked is not None:
                pause = float(asked)
        if attempt == RETRIES:
            break
        headers = {"X-Slack-Retry-Num": str(attempt + 1), "X-Slack-Retry-Reason": reason}
        await asyncio.sleep(pause)
    tally.given_up.add(ts)


@dataclass
class Deployment:
    """An example app running in processes of its own on one loopback port."""

    kind: str
    port: int
    processes: list[subprocess.Popen[bytes]]
    journal: Path
    #: the pids that answered ``GET /stats`` (its ``worker`` id ends with the pid)
    serving: set[int] = field(default_factory=set)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def started(self) -> list[tuple[str, int]]:
        """``(message id, pid)`` of every handler start, across every process, in order."""
        path = self.journal.with_name(self.journal.name + ".started")
        if not path.exists():
            return []
        return [(m, int(p)) for m, p in (line.split() for line in path.read_text().splitlines())]

    def handled(self) -> list[str]:
        """Every message id the handlers finished, across every process, dead ones included."""
        if not self.journal.exists():
            return []
        return self.journal.read_text().split()


@contextlib.asynccontextmanager
async def deployed(
    kind: str, settings: Mapping[str, str], *, workers: int = 2
) -> AsyncIterator[Deployment]:
    """Run the ``kind`` example with ``workers`` processes, configured by ``settings`` (env)."""
    port = free_port()
    journal = Path(tempfile.mkdtemp(prefix="asynclock-platform-")) / "handled"
    env = {
        **os.environ,
        **settings,
        "ASYNCLOCK_EXAMPLE_JOURNAL": str(journal),
        "PORT": str(port),
        "LOG_LEVEL": "WARNING",
    }
    if kind == "fastapi":
        command = [
            sys.executable, "-m", "uvicorn", "examples.fastapi_bot:app", "--host", "127.0.0.1",
            "--port", str(port), "--workers", str(workers), "--log-level", "warning",
        ]  # fmt: skip
        commands = [command]
    else:
        commands = [[sys.executable, "-m", "examples.aiohttp_bot"]] * workers
    # each in a session of its own, so stopping it reaches its children (uvicorn's workers)
    processes = [start_group(c, cwd=ROOT, env=env) for c in commands]
    deployment = Deployment(kind, port, processes, journal)
    try:
        seen = await every_worker_answers(deployment, workers)
        deployment.serving = {int(worker.rsplit(":", 1)[1]) for worker in seen}
        yield deployment
    finally:
        await asyncio.to_thread(stop_groups, processes, 20.0)
        journal.unlink(missing_ok=True)
        journal.with_name(journal.name + ".started").unlink(missing_ok=True)
        journal.parent.rmdir()


async def every_worker_answers(deployment: Deployment, workers: int) -> set[str]:
    """Wait until ``GET /stats`` was answered by ``workers`` distinct worker ids."""
    seen: set[str] = set()
    deadline = time.monotonic() + STARTUP
    while len(seen) < workers:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {sorted(seen)} answered within {STARTUP} s")
        for process in deployment.processes:
            if process.poll() is not None:
                raise AssertionError(f"{deployment.kind} exited with {process.returncode}")
        try:
            # a connection of its own each time, so the kernel may pick another worker
            async with httpx.AsyncClient(base_url=deployment.base_url, timeout=5.0) as client:
                seen.add((await client.get("/stats")).json()["worker"])
        except httpx.TransportError:
            await asyncio.sleep(0.1)
    return seen


async def worker_running(deployment: Deployment, message_id: str, within: float = 30.0) -> int:
    """The pid of the worker whose handler started on ``message_id`` (the journal's record).

    Under the durable inbox the key's lock names no process (the inbox hands keys out under
    owners of its own), so the example's journal tells which worker is handling the event.
    """
    deadline = time.monotonic() + within
    # a file the workers append to: polled, there is nothing to wait on
    while not (pids := [p for m, p in deployment.started() if m == message_id]):
        if time.monotonic() > deadline:
            raise AssertionError(f"no worker started on {message_id!r} within {within} s")
        await asyncio.sleep(0.01)
    return pids[0]


@dataclass
class Result:
    """One run: what the platform was told, and what the handlers did."""

    tally: Tally
    handled: list[str]
    events: int
    killed: int | None

    @property
    def lost(self) -> set[str]:
        """Answered 2xx, never handled: the platform stopped redelivering an event never run."""
        return set(self.tally.acked) - set(self.handled)

    @property
    def never_handled(self) -> int:
        return self.events - len(set(self.handled))

    def row(self) -> dict[str, object]:
        return {
            "events": self.events,
            "answered 2xx": len(self.tally.acked),
            "2xx but never handled": len(self.lost),
            "never handled": self.never_handled,
            "handled twice": sum(n > 1 for n in Counter(self.handled).values()),
            "given up after the retries": len(self.tally.given_up),
            "acknowledged after n retries": dict(sorted(self.tally.retries_used.items())),
            "answers": dict(self.tally.statuses),
            "deliveries": self.tally.deliveries,
            "killed": self.killed,
        }


async def run_scenario(
    kind: str,
    settings: Mapping[str, str],
    load: Load,
    *,
    kill: bool,
    settle: float,
) -> Result:
    """Deliver ``load`` to a fresh 2-worker deployment; ``kill -9`` one worker mid-burst.

    ``settle``: seconds given, once the platform is done, for accepted events to be handled
    (a dead worker's inbox key is taken over after its lock TTL).
    """
    run = uuid.uuid4().hex[:6]
    events = load.payloads(str(int(run, 16) % 900 + 100))
    path = "/slack/events"
    tally = Tally()
    async with deployed(kind, settings) as deployment:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=deployment.base_url, limits=limits) as client:

            async def burst(thread: list[tuple[str, dict[str, object]]]) -> None:
                sends = []
                for ts, payload in thread:
                    sends.append(asyncio.create_task(deliver(client, path, ts, payload, tally)))
                    await asyncio.sleep(load.spacing)
                await asyncio.gather(*sends)

            threads = [events[i : i + load.messages] for i in range(0, len(events), load.messages)]
            platform = asyncio.gather(*(burst(t) for t in threads))
            killed = None
            if kill:
                killed = await kill_mid_burst(deployment, len(events))
            await platform
        wanted = set(tally.acked)
        deadline = time.monotonic() + settle
        # the journal is a file other processes append to: polled, there is nothing to wait on
        while not wanted <= set(deployment.handled()) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        handled = deployment.handled()
    return Result(tally, handled, len(events), killed)


async def kill_mid_burst(deployment: Deployment, events: int) -> int:
    """``kill -9`` a worker once the first events are handled (its pid is returned).

    The first events of every thread are handled at once, each in one of the workers, so the
    victim dies with handlers running and deliveries unanswered.
    """
    deadline = time.monotonic() + 30.0
    while len(deployment.handled()) < max(1, events // 50):
        if time.monotonic() > deadline:
            raise AssertionError(f"no burst under way: {len(deployment.handled())} handled")
        await asyncio.sleep(0.01)
    victim = random.choice(sorted(deployment.serving))
    os.kill(victim, signal.SIGKILL)
    return victim


def settings_for(route: str, policy: str, lock_ttl: float, delay: float) -> dict[str, str]:
    """The environment that configures a shipped example app (its state URL added by callers)."""
    return {
        "ASYNCLOCK_ROUTE": route,
        "ASYNCLOCK_ON_LOCK_CONFLICT": policy,
        "ASYNCLOCK_LOCK_TTL": str(lock_ttl),
        "ASYNCLOCK_EXAMPLE_DELAY": str(delay),
    }


def main() -> None:
    """Run one scenario against the test Redis (a namespace of its own) and print its row."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("fastapi", "aiohttp"), default="fastapi")
    parser.add_argument("--route", choices=("durable", "sync", "background"), default="durable")
    parser.add_argument("--policy", default="queue")
    parser.add_argument("--kill", action="store_true")
    parser.add_argument("--threads", type=int, default=30)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--lock-ttl", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=90.0)
    args = parser.parse_args()
    namespace = uuid.uuid4().hex
    settings = {
        **settings_for(args.route, args.policy, args.lock_ttl, args.delay),
        "ASYNCLOCK_STATE_URL": REDIS.url,
        "ASYNCLOCK_PREFIX": str(REDIS.options(namespace)["prefix"]),
    }
    load = Load(args.threads, args.messages)

    async def measure() -> Result:
        try:
            return await run_scenario(args.kind, settings, load, kill=args.kill, settle=args.settle)
        finally:
            await purge_namespace(REDIS, namespace)

    print(json.dumps(asyncio.run(measure()).row()))


if __name__ == "__main__":
    main()
