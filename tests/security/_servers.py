"""Throwaway ``redis-server`` processes for the security tests: ACL users, TLS.

Each server runs on a free loopback port with nothing persisted, in a temporary directory of
its own, and is killed afterwards; the shared servers of ``.ci/services.sh`` are never touched.
Readiness is a TCP (or TLS) handshake plus a reply to PING, polled with a deadline.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.ports import free_port

START_BOUND = 10.0


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def openssl_binary() -> str | None:
    return shutil.which("openssl")


def _answers(port: int, tls: ssl.SSLContext | None) -> bool:
    """The server replied to PING (``+PONG``, or ``-NOAUTH`` when it wants a login)."""
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=0.5))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname="127.0.0.1"))
            sock.sendall(b"*1\r\n$4\r\nPING\r\n")
            return sock.recv(64)[:1] in (b"+", b"-")
    except OSError:
        return False


class Certificates:
    """A CA and a server certificate for 127.0.0.1, made with ``openssl`` in ``folder``."""

    def __init__(self, openssl: str, folder: Path) -> None:
        self.folder = folder
        self.ca_cert = folder / "ca.crt"
        self.server_cert = folder / "server.crt"
        self.server_key = folder / "server.key"
        ca_key = folder / "ca.key"
        csr = folder / "server.csr"
        ext = folder / "server.ext"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for args in (
            [
                *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key)),
                *("-out", str(self.ca_cert), "-days", "1", "-subj", "/CN=asynclock-test-ca"),
            ],
            [
                *("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.server_key)),
                *("-out", str(csr), "-subj", "/CN=127.0.0.1"),
            ],
            [
                *("x509", "-req", "-in", str(csr), "-CA", str(self.ca_cert), "-CAkey", str(ca_key)),
                *("-CAcreateserial", "-out", str(self.server_cert), "-days", "1"),
                *("-extfile", str(ext)),
            ],
        ):
            subprocess.run(
                [openssl, *args], check=True, capture_output=True, cwd=folder, timeout=60
            )


class RedisProcess:
    """One ``redis-server`` with extra arguments; ``tls_ca`` makes it TLS-only."""

    def __init__(self, binary: str, *extra: str, tls: Certificates | None = None) -> None:
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="asynclock-security-")
        self._log = Path(self._dir.name) / "redis.log"
        args = [binary, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        args += ["--dir", self._dir.name, "--logfile", str(self._log)]
        client_tls: ssl.SSLContext | None = None
        if tls is None:
            args += ["--port", str(self.port)]
        else:
            args += ["--port", "0", "--tls-port", str(self.port)]
            args += ["--tls-cert-file", str(tls.server_cert)]
            args += ["--tls-key-file", str(tls.server_key)]
            args += ["--tls-ca-cert-file", str(tls.ca_cert), "--tls-auth-clients", "no"]
            client_tls = ssl.create_default_context(cafile=str(tls.ca_cert))
        self._proc = subprocess.Popen(
            [*args, *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_BOUND
        while not _answers(self.port, client_tls):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                text = self._log.read_text(errors="replace") if self._log.exists() else ""
                self.close()
                raise RuntimeError(f"redis-server {extra} did not start:\n{text[-2000:]}")
            time.sleep(0.01)

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(START_BOUND)
        with contextlib.suppress(OSError):
            self._dir.cleanup()
