"""The durable inbox across real worker processes, with ``kill -9`` (SPEC section 6).

Workers are started as a user would start them (``python -m asynclock worker MODULE:ATTR``) and
write their effects to a token-fenced store (``tests/_inbox_app.py``). Each test counts: every
accepted event handled (0 lost), per key the first handling of each event in accept order, no
stale write accepted, and a second handling only where ``ctx.attempt > 1``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from redis.asyncio import Redis

from asynclock import Event, EventDispatcher, Outcome, state_from_url
from tests._matrix import INBOX_SERVER_STATES, REDIS, Backend, purge_namespace, require
from tests.support.processes import WorkerProcesses

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = Path(__file__).resolve().parents[2]
KEYS = 20
EVENTS = 300

pytestmark = [pytest.mark.processes, pytest.mark.redis, pytest.mark.timeout(180)]


class Fleet(WorkerProcesses):
    """Worker processes over one namespace, and the effect store they write to."""

    def __init__(self, backend: Backend, namespace: str) -> None:
        super().__init__("inbox-workers-")
        self.backend = backend
        self.prefix = f"asynclock-test:{namespace}:"
        self.namespace = namespace
        self.effects = Redis.from_url(REDIS.url)

    @property
    def workers(self) -> list[subprocess.Popen[bytes]]:
        return self.processes

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            **extra,
            "INBOX_TEST_URL": self.backend.url,
            "INBOX_TEST_PREFIX": self.prefix,
            "INBOX_TEST_EFFECTS": REDIS.url,
            "PYTHONPATH": str(ROOT),
        }

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "asynclock", "worker", "tests._inbox_app:make_bot"]
        return self.launch(command, cwd=ROOT, env=self.env(**env))

    async def handled(self) -> dict[str, list[tuple[str, int, int]]]:
        """Per lock key: (message id, attempt, token) of every effect, in write order."""
        keys = [f"slack:C1:T{k}" for k in range(KEYS)]
        async with self.effects.pipeline(transaction=False) as pipe:  # one round trip
            for key in keys:
                pipe.lrange(f"{self.prefix}fx:{key}", 0, -1)
            lists = await pipe.execute()
        return {
            key: [(m, int(a), int(t)) for m, a, t, _ in (_text(r).split(" ") for r in raw)]
            for key, raw in zip(keys, lists, strict=True)
        }

    async def wait_all(
        self, expected: int, within: float = 90.0
    ) -> dict[str, list[tuple[str, int, int]]]:
        deadline = time.monotonic() + within
        while True:
            found = await self.handled()
            if len({m for effects in found.values() for m, _, _ in effects}) >= expected:
                return found
            for worker in self.workers:
                if worker.poll() not in (None, -signal.SIGKILL):
                    raise AssertionError(f"a worker exited {worker.returncode}: {self.output()}")
            assert time.monotonic() < deadline, f"not all handled after {within} s\n{self.output()}"
            await asyncio.sleep(0.05)

    async def inside(self) -> int | None:
        """The pid of a worker in the middle of a handler right now, if any."""
        running = await self.effects.hgetall(f"{self.prefix}inside")
        pids = {int(pid) for pid, count in running.items() if int(count) > 0}
        return next((w.pid for w in self.workers if w.pid in pids and w.poll() is None), None)

    async def ready(self, within: float = 30.0) -> None:
        """Wait until every worker still running listens for SIGTERM (``_inbox_app.py``)."""
        deadline = time.monotonic() + within
        while True:
            marked = {int(pid) for pid in await self.effects.smembers(f"{self.prefix}ready")}
            if all(w.pid in marked for w in self.workers if w.poll() is None):
                return
            assert time.monotonic() < deadline, f"workers not ready after {within} s"
            await asyncio.sleep(0.01)

    def stop(self, within: float = 20.0) -> list[int]:
        return super().stop(within)


@pytest.fixture(params=INBOX_SERVER_STATES)
async def fleet(request: pytest.FixtureRequest) -> AsyncIterator[Fleet]:
    backend: Backend = request.param
    require(REDIS)  # the effect store
    require(backend)
    made = Fleet(backend, uuid.uuid4().hex)
    try:
        yield made
    finally:
        made.kill()
        await made.effects.aclose()
        await purge_namespace(REDIS, made.namespace)
        if backend is not REDIS:  # the state lives elsewhere too
            await purge_namespace(backend, made.namespace)
        shutil.rmtree(made.folder, ignore_errors=True)


def event(key: int, seq: int) -> Event:
    return Event("message", "slack", "C1", f"T{key}", f"k{key}-{seq:03d}")


async def accept_all(fleet: Fleet, events: list[Event]) -> None:
    state = state_from_url(fleet.backend.url, prefix=fleet.prefix)
    try:
        bot = EventDispatcher(state, on_lock_conflict="queue")

        async def one_key(thread: str) -> list[Outcome]:
            # one key's events one after the other, so their accept order is the list's (the
            # keys go concurrently: concurrent accepts of one key are ordered by the server)
            return [await bot.accept(e) for e in events if e.thread_id == thread]

        threads = dict.fromkeys(e.thread_id for e in events)
        outcomes = await asyncio.gather(*(one_key(t) for t in threads))
        assert {o for per_key in outcomes for o in per_key} == {Outcome.ACCEPTED}
    finally:
        await state.aclose()


def check_history(found: dict[str, list[tuple[str, int, int]]], events: list[Event]) -> int:
    """Assert the history; return how many events were handled more than once."""
    doubles = 0
    for k in range(KEYS):
        key = f"slack:C1:T{k}"
        expected = [e.message_id for e in events if e.thread_id == f"T{k}"]
        effects = found[key]
        firsts = list(dict.fromkeys(m for m, _, _ in effects))
        assert firsts == expected, f"{key}: first handlings out of accept order: {firsts}"
        seen: set[str] = set()
        for message, attempt, _ in effects:
            if message in seen:
                doubles += 1
                assert attempt > 1, f"{message} handled twice, the second with attempt 1"
            seen.add(message)
        tokens = [t for _, _, t in effects]
        assert tokens == sorted(tokens), f"{key}: tokens went backwards {tokens}"
    return doubles


async def test_three_workers_a_kill_9_mid_handler_and_a_new_one(fleet: Fleet) -> None:
    for _ in range(3):
        fleet.start()
    events = [event(n % KEYS, n // KEYS) for n in range(EVENTS)]
    # accepting goes on while the workers drain, and while one of them is killed: were the kill
    # to wait for the last accept, fast workers could have handled everything by then
    accepting = asyncio.create_task(accept_all(fleet, events))
    # kill a worker in the middle of a handler once a third of the events were handled
    deadline = time.monotonic() + 60
    victim = None
    while victim is None:
        found = await fleet.handled()
        if sum(map(len, found.values())) >= EVENTS // 3:
            victim = await fleet.inside()
        assert time.monotonic() < deadline, (
            f"no worker seen mid-handler ({sum(map(len, found.values()))} handled, "
            f"accepting done: {accepting.done()})\n{fleet.output()}"
        )
        await asyncio.sleep(0.002)
    os.kill(victim, signal.SIGKILL)
    fleet.start()
    await asyncio.wait_for(accepting, 60)
    found = await fleet.wait_all(EVENTS)
    doubles = check_history(found, events)
    assert int(await fleet.effects.get(f"{fleet.prefix}stale") or 0) == 0
    await fleet.ready()
    codes = fleet.stop()
    assert sorted(codes) == [-signal.SIGKILL, 0, 0, 0], codes
    # only entries the killed worker had in hand (at most one per key it was draining) ran twice
    assert doubles <= KEYS
    state = state_from_url(fleet.backend.url, prefix=fleet.prefix)
    try:
        assert await state.inbox_ready() == []  # type: ignore[attr-defined]
    finally:
        await state.aclose()


async def test_accepted_then_the_only_process_killed_a_fresh_worker_handles_all(
    fleet: Fleet,
) -> None:
    # A webhook process accepts 50 events (answering the platform after each) and is killed
    # before anything ran; a worker started afterwards handles every one, in order per key.
    script = (
        "import asyncio, os, signal, sys\n"
        "from asynclock import Event, EventDispatcher, state_from_url\n"
        "async def main():\n"
        f"    state = state_from_url({fleet.backend.url!r}, prefix={fleet.prefix!r})\n"
        "    bot = EventDispatcher(state, on_lock_conflict='queue')\n"
        "    for n in range(50):\n"
        f"        await bot.accept(Event('message', 'slack', 'C1', f'T{{n % {KEYS}}}', "
        f"f'k{{n % {KEYS}}}-{{n // {KEYS}:03d}}'))\n"
        "    print('accepted', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    webhook = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        cwd=ROOT,
        env=fleet.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(webhook.communicate(), 60)
    assert webhook.returncode == -signal.SIGKILL, err.decode()
    assert out == b"accepted\n"
    fleet.start()
    events = [event(n % KEYS, n // KEYS) for n in range(50)]
    found = await fleet.wait_all(50)
    assert check_history(found, events) == 0
    await fleet.ready()
    assert fleet.stop() == [0]


async def test_latest_a_kill_9_mid_batch_redelivers_the_whole_batch(fleet: Fleet) -> None:
    # Under on_lock_conflict="latest" each key's pending events are one batch, one call (0.5 s
    # here, so the kill lands inside it). Killed mid-call, nothing of the batch was acked: the
    # next worker takes the key over after the lock TTL and handles the whole batch again, with
    # ctx.attempt 2; nothing is lost, and nothing is written with a stale token.
    events = [event(n % KEYS, n // KEYS) for n in range(5 * KEYS)]
    await accept_all(fleet, events)
    folding = {"INBOX_TEST_POLICY": "latest", "INBOX_TEST_PAUSE": "0.5"}
    fleet.start(**folding)
    deadline = time.monotonic() + 60
    while (victim := await fleet.inside()) is None:
        assert time.monotonic() < deadline, f"no worker seen mid-call\n{fleet.output()}"
        await asyncio.sleep(0.002)
    os.kill(victim, signal.SIGKILL)
    fleet.start(**folding)
    found = await fleet.wait_all(len(events))
    check_history(found, events)
    assert int(await fleet.effects.get(f"{fleet.prefix}stale") or 0) == 0
    redelivered = [
        key
        for key, effects in found.items()
        if {m for m, a, _ in effects if a == 2} == {m for m, _, _ in effects}
    ]
    assert redelivered, f"no batch was redelivered whole: {found}"
    await fleet.ready()
    assert fleet.stop() == [-signal.SIGKILL, 0]
    state = state_from_url(fleet.backend.url, prefix=fleet.prefix)
    try:
        assert await state.inbox_ready() == []  # type: ignore[attr-defined]
    finally:
        await state.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
