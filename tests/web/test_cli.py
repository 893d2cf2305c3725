"""``asynclock dashboard``: the command serves the page on loopback, answers only loopback host
names, stops cleanly on SIGTERM, and fails at once on a bad state URL or option."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx
import pytest

from asynclock import state_from_url
from tests._helpers import eventually
from tests._matrix import REDIS, TEST_PREFIX, purge_namespace, require
from tests.conftest import new_namespace
from tests.support.ports import free_port
from tests.web._helpers import accept, key_of


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "asynclock", "dashboard", *args]


@pytest.mark.redis
async def test_serves_the_page_on_loopback_and_stops_on_sigterm() -> None:
    require(REDIS)
    namespace = new_namespace()
    prefix = f"{TEST_PREFIX}{namespace}:"
    state = state_from_url(REDIS.url, prefix=prefix)
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *_command("--state", REDIS.url, "--prefix", prefix, "--port", str(port)),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    stderr_pipe = process.stderr
    assert stderr_pipe is not None
    try:
        await accept(state, "T1", 2)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

            async def answering() -> bool:
                if process.returncode is not None:
                    raise AssertionError(f"the command ended: {await stderr_pipe.read()!r}")
                try:
                    return (await http.get("/")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(answering, within=20.0, interval=0.1)
            page = (await http.get("/")).text
            assert key_of("T1") in page
            assert "read-only" in page
            # a page of another site whose name now points at 127.0.0.1 is not answered
            rebound = await http.get("/", headers={"host": f"evil.example:{port}"})
            assert rebound.status_code == 421
            assert key_of("T1") not in rebound.text
            by_name = await http.get("/", headers={"host": f"localhost:{port}"})
            assert by_name.status_code == 200
        process.send_signal(signal.SIGTERM)
        returncode = await asyncio.wait_for(process.wait(), 20)
        stderr = (await stderr_pipe.read()).decode()
        assert returncode == 0, stderr
        assert f"http://127.0.0.1:{port}/ (read-only)" in stderr
        assert "Traceback" not in stderr
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await state.aclose()
        await purge_namespace(REDIS, namespace)


def test_a_state_that_does_not_answer_fails_at_once() -> None:
    done = subprocess.run(
        _command("--state", "redis://:pw-not-shown@127.0.0.1:1/0", "--port", str(free_port())),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "the state is unavailable" in done.stderr
    assert "pw-not-shown" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--state", "redis://127.0.0.1:6379/0", "--port", "70000"),
            "must be a port from 0 to 65535",
        ),
        (("--state", "redis://127.0.0.1:6379/0", "--refresh", "-1"), "must be finite seconds >= 0"),
        (("--port", "8765"), "--state"),
        (("--state", "nope://x"), "nope"),
    ],
)
def test_bad_options_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    done = subprocess.run(_command(*args), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert message in done.stderr
