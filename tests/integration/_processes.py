"""Start and stop the bot processes of the cross-process tests (``_bot_process.py``)."""

from __future__ import annotations

import asyncio
import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = Path(__file__).resolve().parents[2]
STARTUP = 60.0


@asynccontextmanager
async def bot_processes(
    kind: str, count: int, *, state_url: str, prefix: str, api_url: str
) -> AsyncIterator[list[str]]:
    """``count`` processes of ``kind`` sharing one state; yields their base URLs.

    On exit each gets SIGTERM and must exit 0 within the bound (a clean shutdown).
    """
    env = {
        **os.environ,
        "BOT_STATE_URL": state_url,
        "BOT_PREFIX": prefix,
        "BOT_API_URL": api_url,
        "PYTHONPATH": str(ROOT),
    }
    started: list[asyncio.subprocess.Process] = []
    try:
        urls = []
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
            started.append(process)
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), STARTUP)
            assert line.startswith(b"PORT "), f"bot process did not start: {line!r}"
            urls.append(f"http://127.0.0.1:{int(line.split()[1])}")
        yield urls
    finally:
        for process in started:
            if process.returncode is None:
                process.terminate()
        codes = [await asyncio.wait_for(p.wait(), STARTUP) for p in started]
    assert codes == [0] * len(started), f"bot processes exited with {codes}"
