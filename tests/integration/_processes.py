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

    from tests.integration._standins import Recorder

ROOT = Path(__file__).resolve().parents[2]
STARTUP = 60.0


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


@asynccontextmanager
async def bot_processes(
    kind: str, count: int, *, prefix: str, api_url: str, state_url: str, serve: bool = True
) -> AsyncIterator[Bots]:
    """``count`` processes of ``kind`` sharing one state (``serve``: each drains the inbox).

    On exit each live one gets SIGTERM and must exit 0 (a clean shutdown, its work drained).
    """
    env = {
        **os.environ,
        "BOT_STATE_URL": state_url,
        "BOT_PREFIX": prefix,
        "BOT_API_URL": api_url,
        "BOT_SERVE": "1" if serve else "0",
        "PYTHONPATH": str(ROOT),
    }
    bots = Bots([], [])
    try:
        for _ in range(count):
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration._bot_process",
                kind,
                cwd=ROOT,
                env=env,
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
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "asynclock",
        "worker",
        target,
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
    )
    try:
        yield
    finally:
        if process.returncode is None:
            process.terminate()
        code = await asyncio.wait_for(process.wait(), STARTUP)
    assert code == 0, f"asynclock worker {target} exited with {code}"


#: (process URL, conversation, event number, retry number or None) -> the HTTP status
Deliver = Callable[[str, int, int, "int | None"], "Awaitable[int]"]


async def deliver_each_twice(
    urls: list[str], conversations: int, per_conversation: int, deliver: Deliver
) -> int:
    """Send every conversation's events in order, conversations at once; return how many.

    Each event goes to one process and, at the same time, its redelivery (retry 1) to the next
    one: the platform retrying an event whose first answer it did not wait for. The next event
    of the conversation is sent once both are answered.
    """

    async def conversation(c: int) -> None:
        for n in range(per_conversation):
            first, retry = await asyncio.gather(
                deliver(urls[n % len(urls)], c, n, None),
                deliver(urls[(n + 1) % len(urls)], c, n, 1),
            )
            assert (first, retry) == (200, 200), (c, n, first, retry)

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
