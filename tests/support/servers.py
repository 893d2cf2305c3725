"""Throwaway ``redis-server`` processes that a test starts, breaks and stops itself.

The fault, Sentinel and security tests stop, restart, pause and reconfigure servers: they must
never do that to the shared servers of ``.ci/services.sh``. Each :class:`RedisProcess` listens
on a free loopback port, keeps its files in a folder of the caller's, and is killed afterwards.
Every wait is on a condition with a deadline (the port answers PING, the process exited), never
a fixed sleep.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING

import pytest

from tests._matrix import IN_CI
from tests.support.ports import free_port

if TYPE_CHECKING:
    import ssl
    from collections.abc import Sequence
    from pathlib import Path

#: seconds a server may take to start answering, or to exit after being told to
START_BOUND = 10.0


def require_binary(name: str, why: str) -> str:
    """The path of the program ``name``; without it, skip the test locally and fail it in CI
    (``CI=true``), like the backend matrix. ``why`` says what the tests need it for."""
    found = shutil.which(name)
    if found is None:
        reason = f"{name} is not installed: {why}"
        if IN_CI:
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(reason)
    return found


def answers_ping(
    port: int, *, timeout: float = 0.2, tls: ssl.SSLContext | None = None, login: bool = False
) -> bool:
    """The server on ``127.0.0.1:port`` replied ``+PONG`` to PING (with ``login``, any reply,
    ``-NOAUTH`` included: a server that wants a login is up). ``tls``: over TLS."""
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(
                socket.create_connection(("127.0.0.1", port), timeout=timeout)
            )
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname="127.0.0.1"))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return reply[:1] in (b"+", b"-") if login else reply.startswith(b"+PONG")


class RedisProcess:
    """One ``redis-server`` (or sentinel) on ``127.0.0.1:port``, its files in ``folder``.

    ``args`` come first (a sentinel's config file must), then the bind address, the folder
    and the log file. ``port_args`` name the port (default ``--port <port>``; a TLS-only
    server passes ``--port 0 --tls-port <port>`` and ``tls`` for the readiness check).
    :meth:`start` may be called again after :meth:`stop`: same port, same arguments.
    """

    def __init__(
        self,
        binary: str,
        folder: Path,
        *args: str,
        name: str = "redis-server",
        port: int | None = None,
        port_args: Sequence[str] | None = None,
        tls: ssl.SSLContext | None = None,
        login: bool = False,
    ) -> None:
        self.port = port or free_port()
        self.name = name
        self.folder = folder
        self.starts = 0
        self._argv = [binary, *args]
        self._argv += port_args if port_args is not None else ["--port", str(self.port)]
        self._argv += ["--bind", "127.0.0.1", "--daemonize", "no", "--dir", str(folder)]
        self._tls = tls
        self._login = login
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, log: Path | None = None) -> None:
        """Start the server (its log to ``log``, default ``<folder>/<name>.log``) and wait until
        it answers PING; a server that exits or stays silent is killed and raises."""
        assert not self.running, "already running"
        log = log or self.folder / f"{self.name}.log"
        self._proc = subprocess.Popen(
            [*self._argv, "--logfile", str(log)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.starts += 1
        deadline = time.monotonic() + START_BOUND
        # a TLS handshake (RSA keys) takes longer than a plain connection on a loaded machine
        timeout = 0.2 if self._tls is None else 0.5
        while not answers_ping(self.port, timeout=timeout, tls=self._tls, login=self._login):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop(kill=True)
                text = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(
                    f"{self.name} on port {self.port} did not start:\n{text[-2000:]}"
                )
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

    def kill(self) -> None:
        """SIGKILL the server (no goodbye to anyone) and wait until it has exited."""
        self.stop(kill=True)
