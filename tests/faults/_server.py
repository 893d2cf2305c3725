"""A throwaway ``redis-server`` on a free loopback port, started and stopped by the test.

Fault tests stop, restart and pause servers: they must never do that to the shared server of
``.ci/services.sh``, so each test gets its own process with nothing persisted (``--save ""``,
no AOF), or, with ``durable=True``, an append-only file fsynced on every write
(``--appendfsync always``), so a restart keeps every write it confirmed (the durable inbox's
soak). Every wait here is on a condition with a deadline (the port answers PING, the process
exited), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.ports import free_port

#: seconds a server may take to start answering, or to exit after being told to
START_BOUND = 10.0


def redis_server_binary() -> str | None:
    """The path of ``redis-server``, or ``None`` when it is not installed."""
    return shutil.which("redis-server")


def _ping(port: int, timeout: float) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` process on ``127.0.0.1:port``; :meth:`restart` keeps the port."""

    def __init__(self, binary: str, port: int | None = None, *, durable: bool = False) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.durable = durable
        self._dir = tempfile.TemporaryDirectory(prefix="asynclock-faults-")
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        assert not self.running, "already running"
        log = Path(self._dir.name) / f"redis-{self.starts}.log"
        self._proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.durable else "no",
                "--appendfsync",
                "always",
                "--daemonize",
                "no",
                "--dir",
                self._dir.name,
                "--logfile",
                str(log),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.starts += 1
        deadline = time.monotonic() + START_BOUND
        while not _ping(self.port, 0.2):
            if self._proc.poll() is not None:
                text = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"redis-server on port {self.port} exited:\n{text[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer PING")
            time.sleep(0.005)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with ``kill``) and wait until it has exited."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(START_BOUND)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(START_BOUND)

    def restart(self, *, kill: bool = False) -> None:
        """Stop the server and start a new one on the same port (its data is gone, unless
        ``durable``: then it reloads its append-only file)."""
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        self.stop(kill=True)
        with contextlib.suppress(OSError):
            self._dir.cleanup()
