"""Throwaway ``redis-server`` processes for the security tests: ACL users, TLS.

Each server runs on a free loopback port with nothing persisted, in a temporary directory of
its own, and is killed afterwards; the shared servers of ``.ci/services.sh`` are never touched.
Readiness is a TCP (or TLS) handshake plus a reply to PING, polled with a deadline
(:class:`tests.support.servers.RedisProcess`).
"""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import tempfile
from pathlib import Path

from tests.support.ports import free_port
from tests.support.servers import RedisProcess


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


class SecureRedis(RedisProcess):
    """One ``redis-server`` with extra arguments, in a folder of its own; with ``tls``, TLS-only
    (no plain port) with that certificate."""

    def __init__(self, binary: str, *extra: str, tls: Certificates | None = None) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="asynclock-security-")
        port = free_port()
        args = ["--save", "", "--appendonly", "no"]
        port_args = None
        client_tls: ssl.SSLContext | None = None
        if tls is not None:
            port_args = ["--port", "0", "--tls-port", str(port)]
            args += ["--tls-cert-file", str(tls.server_cert)]
            args += ["--tls-key-file", str(tls.server_key)]
            args += ["--tls-ca-cert-file", str(tls.ca_cert), "--tls-auth-clients", "no"]
            client_tls = ssl.create_default_context(cafile=str(tls.ca_cert))
        super().__init__(
            binary,
            Path(self._dir.name),
            *args,
            *extra,
            name=f"redis-server {extra}",
            port=port,
            port_args=port_args,
            tls=client_tls,
            login=True,  # -NOAUTH is an answer: the ACL server wants a login
        )
        try:
            self.start()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.stop(kill=True)
        with contextlib.suppress(OSError):
            self._dir.cleanup()
