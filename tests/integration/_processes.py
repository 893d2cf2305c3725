"""The cross-process scenarios: bot processes (``_bot_process.py``) and what their replies show."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable

    from asynclock import LockInfo, State
    from tests.integration._standins import Recorder

ROOT = Path(__file__).resolve().parents[2]
#: seconds a process may take to start: importing aiogram alone is ~10 s of CPU, several times
#: that on a loaded 2-core machine
STARTUP = 150.0


@dataclass
class Bots:
    """Running bot processes: their base URLs, and the ones killed on purpose."""

    urls: list[str]
    processes: list[asyncio.subprocess.Process]
    killed: set[int] = field(default_factory=set)

    async def kill(self, index: int) -> None:
        """SIGKILL process ``index`` (nothing of it runs after this returns)."""
        self.killed.add(index)
        self.processes[index].send_signal(signal.SIGKILL)
        await asyncio.wait_for(self.processes[index].wait(), STARTUP)

    async def kill_pid(self, pid: int) -> int:
        """SIGKILL the process with ``pid``; return its index."""
        for index, process in enumerate(self.processes):
            if process.pid == pid and process.returncode is None:
                await self.kill(index)
                return index
        raise AssertionError(f"no running process {pid} among {[p.pid for p in self.processes]}")


@asynccontextmanager
async def bot_processes(
    kind: str,
    count: int,
    *,
    prefix: str,
    api_url: str,
    state_url: str,
    serve: bool = True,
    settings: dict[str, str] | None = None,
    each: list[dict[str, str]] | None = None,
) -> AsyncIterator[Bots]:
    """``count`` processes of ``kind`` sharing one state (``serve``: each drains the inbox).

    ``settings`` are more ``BOT_*`` variables for every process (see ``_bot_process.py``),
    ``each[i]`` more for process ``i`` alone. On exit each live one gets SIGTERM and must exit 0
    (a clean shutdown, its work drained).
    """
    env = {
        **os.environ,
        "BOT_STATE_URL": state_url,
        "BOT_PREFIX": prefix,
        "BOT_API_URL": api_url,
        "BOT_SERVE": "1" if serve else "0",
        "PYTHONPATH": str(ROOT),
        **(settings or {}),
    }
    bots = Bots([], [])
    try:
        for index in range(count):
            own = each[index] if each is not None and index < len(each) else {}
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration._bot_process",
                kind,
                cwd=ROOT,
                env={**env, **own},
                stdout=asyncio.subprocess.PIPE,
            )
            bots.processes.append(process)
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), STARTUP)
            assert line.startswith(b"PORT "), f"bot process did not start: {line!r}"
            bots.urls.append(f"http://127.0.0.1:{int(line.split()[1])}")
        yield bots
    finally:
        for process in bots.processes:
            if process.returncode is None:
                process.terminate()
        codes = [await asyncio.wait_for(p.wait(), STARTUP) for p in bots.processes]
    clean = [code for i, code in enumerate(codes) if i not in bots.killed]
    assert clean == [0] * len(clean), f"bot processes exited with {codes}"


@asynccontextmanager
async def asynclock_worker(target: str, env: dict[str, str]) -> AsyncIterator[None]:
    """``python -m asynclock worker TARGET`` with ``env`` added; on exit SIGTERM, must exit 0."""
    async with asynclock_workers(target, env, 1):
        yield


@asynccontextmanager
async def asynclock_workers(target: str, env: dict[str, str], count: int) -> AsyncIterator[Bots]:
    """``count`` processes of ``python -m asynclock worker TARGET`` (``Bots.urls`` is empty);
    on exit each live one gets SIGTERM and must exit 0."""
    workers = Bots([], [])
    try:
        for _ in range(count):
            workers.processes.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "asynclock",
                    "worker",
                    target,
                    cwd=ROOT,
                    env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                )
            )
        yield workers
    finally:
        for process in workers.processes:
            if process.returncode is None:
                process.terminate()
        codes = [await asyncio.wait_for(p.wait(), STARTUP) for p in workers.processes]
    clean = [code for i, code in enumerate(codes) if i not in workers.killed]
    assert clean == [0] * len(clean), f"asynclock worker {target} exited with {codes}"


#: deliveries of one event answered 503 (in progress elsewhere) before the test gives up
IN_PROGRESS_RETRIES = 100

#: (process URL, conversation, event number, retry number or None) -> the HTTP status
Deliver = Callable[[str, int, int, "int | None"], "Awaitable[int]"]


async def deliver_each_twice(
    urls: list[str], conversations: int, per_conversation: int, deliver: Deliver
) -> int:
    """Send every conversation's events in order, conversations at once; return how many.

    Each event goes to one process and, at the same time, its redelivery (retry 1) to the next
    one: the platform retrying an event whose first answer it did not wait for. Whichever of
    the two finds the other in progress may be answered 503 (SPEC 12: never a 2xx for a
    redelivery in progress), and is delivered again, as the platform would, until a 200. The
    next event of the conversation is sent once both are answered 200.
    """

    async def conversation(c: int) -> None:
        for n in range(per_conversation):
            targets = (urls[n % len(urls)], urls[(n + 1) % len(urls)])
            answers = list(
                await asyncio.gather(deliver(targets[0], c, n, None), deliver(targets[1], c, n, 1))
            )
            for i, url in enumerate(targets):
                retry = 1
                while answers[i] == 503 and retry < IN_PROGRESS_RETRIES:
                    await asyncio.sleep(0.1)  # the platform's schedule, not a race's
                    retry += 1
                    answers[i] = await deliver(url, c, n, retry)
            assert answers == [200, 200], (c, n, answers)

    await asyncio.gather(*(conversation(c) for c in range(conversations)))
    return conversations * per_conversation


@dataclass(frozen=True)
class Figures:
    """What the platform's stand-in saw: the numbers of the issue's closing note."""

    events: int
    redeliveries: int
    replies: int
    duplicates: int
    lost: int

    def __str__(self) -> str:
        return (
            f"events={self.events} redeliveries={self.redeliveries} replies={self.replies} "
            f"duplicates={self.duplicates} lost={self.lost}"
        )


def tally(
    recorder: Recorder, expected: dict[str, list[str]], redeliveries: int
) -> tuple[Figures, dict[str, list[str]]]:
    """The figures, and each conversation's replies in arrival order (to compare to ``expected``)."""
    got = {
        conversation: [text.removeprefix("re: ") for text in recorder.texts(conversation)]
        for conversation in expected
    }
    wanted = {text for texts in expected.values() for text in texts}
    seen = Counter(r.text.removeprefix("re: ") for r in recorder.replies)
    figures = Figures(
        events=len(wanted),
        redeliveries=redeliveries,
        replies=len(recorder.replies),
        duplicates=sum(n - 1 for n in seen.values()),
        lost=len(wanted - set(seen)),
    )
    return figures, got


async def held(state: State, key: str, within: float = 30.0) -> LockInfo:
    """The lock ``key`` once someone holds it: a handler is running for the key."""
    deadline = asyncio.get_running_loop().time() + within
    while (info := await state.inspect(key)) is None:  # another process's lock: nothing to await
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"nobody took {key!r} within {within} s")
        await asyncio.sleep(0.01)
    return info


async def holder_pid(state: State, key: str, within: float = 30.0) -> int:
    """The pid of the process holding lock ``key`` once someone does: the process a test kills
    mid-handler. For a lock taken by a dispatch (``AsyncLock`` owner ids are
    ``<host>:<pid>:<task>:<random>``); an inbox key handed out to a worker has an owner that
    names no process (``inbox-handout:<random>`` on Redis)."""
    info = await held(state, key, within)
    parts = info.owner.split(":")
    names_a_process = len(parts) == 4 and parts[1].isdigit()
    assert names_a_process, f"{key!r} is held by {info.owner!r}, which names no process"
    return int(parts[1])
