"""Throwaway servers of a run and the Redis Cluster the command line names.

``--private-server`` starts a :class:`PrivateServer` (one ``redis-server``) for the whole run and
lets the scenarios that need a cluster start a :class:`PrivateCluster`; otherwise they use
``--cluster URL`` or the 3-master cluster of ``.ci/services.sh``. Both servers run without
persistence on free loopback ports and are stopped by their own process handles on exit.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio

from benchmarks.harness.env import is_loopback_url, log

if TYPE_CHECKING:
    import contextlib
    from collections.abc import Callable

    from typing_extensions import Self

DEFAULT_CLUSTER_URL = os.environ.get(
    "ASYNCLOCK_BENCH_CLUSTER_URL", "redis+cluster://127.0.0.1:7000"
)
#: what every throwaway server runs with: no persistence, in the foreground, quiet
QUIET = ["--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]


@dataclass
class ClusterSettings:
    """Set by the command line: ``--cluster URL`` and ``--private-server``."""

    url: str | None = None  # None: DEFAULT_CLUSTER_URL, or a private cluster
    private: bool = False


SETTINGS = ClusterSettings()


def configure(*, url: str | None, private: bool) -> None:
    """Record ``--cluster URL`` and ``--private-server`` for the scenarios."""
    SETTINGS.url, SETTINGS.private = url, private


def configured_url() -> str:
    """The cluster the command line named (``--cluster``), else :data:`DEFAULT_CLUSTER_URL`."""
    return SETTINGS.url or DEFAULT_CLUSTER_URL


def first_node(url: str) -> tuple[str, int, str | None, str | None]:
    """Host, port, user and password of the first node of a (cluster) URL."""
    parts = urlsplit(url)
    first = parts.netloc.rpartition("@")[2].split(",")[0]
    host, sep, port = first.rpartition(":")
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    return host.strip("[]") or "127.0.0.1", int(port) if sep else 6379, user, password


def cluster_url(stack: contextlib.ExitStack, scenario: str) -> tuple[str | None, str]:
    """The cluster a scenario runs against (``--cluster``, a private one entered on ``stack``
    with ``--private-server``, else the one of ``.ci/services.sh``), or why there is none."""
    if SETTINGS.url is None and SETTINGS.private:
        try:
            cluster = stack.enter_context(PrivateCluster())
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            log(f"{scenario}: cannot start a private cluster: {exc!r}")
            return None, f"no private cluster: {exc}"
        log(f"{scenario}: private 3-master cluster on {cluster.url}")
        return cluster.url, ""
    url = configured_url()
    host, port, *_ = first_node(url)
    if not is_loopback_url(f"redis://{host}:{port}"):
        return None, f"{url} is not a loopback address"
    return url, ""


def free_port(taken: list[int], bus: bool = False) -> int:
    """A free loopback port not in ``taken`` (with ``bus``: its cluster bus port +10000 too)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port in taken or (bus and port + 10000 > 65535):
            continue
        if bus:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
                    other.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate ``procs`` (our own servers, by object), killing those that do not end."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()


def wait_ready(
    procs: list[subprocess.Popen[bytes]], port: int, ready: Callable[[redis.Redis], bool], what: str
) -> None:
    """Wait up to 20 s for the server on ``port`` to be ``ready``; raise if one of ``procs`` died."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"redis-server exited with {proc.returncode}: {err}")
        try:
            with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
                if ready(client):
                    return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on 127.0.0.1:{port} {what} within 20 s")


def _cluster_ok(client: redis.Redis) -> bool:
    info = cast("Any", client).execute_command("CLUSTER", "INFO")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "cluster_state:ok" in text


class PrivateServer:
    """A throwaway ``redis-server``: its command counts are the benchmark's own, unlike those of
    a shared server that a test suite is using at the same time."""

    def __init__(self, binary: str = "redis-server") -> None:
        self.binary = binary
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> Self:
        self.port = free_port([])
        args = [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), *QUIET]
        self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        try:
            wait_ready(self.procs, self.port, lambda c: bool(c.ping()), "did not answer")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        stop_all(self.procs)


class PrivateCluster(PrivateServer):
    """Three throwaway cluster-mode masters joined with ``redis-cli --cluster create`` (no
    replicas, no persistence: the same settings as the private single server)."""

    def __init__(self, masters: int = 3) -> None:
        super().__init__()
        self.masters = masters
        self.ports: list[int] = []
        self.dir = ""

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def __enter__(self) -> Self:
        self.dir = tempfile.mkdtemp(prefix="asynclock-bench-cluster-")
        try:
            for _ in range(self.masters):
                self.ports.append(free_port(self.ports, bus=True))
            for port in self.ports:
                args = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), *QUIET]
                args += ["--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"]
                args += ["--cluster-node-timeout", "5000", "--dir", self.dir]
                self.procs.append(
                    subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                )
            for port in self.ports:
                wait_ready(self.procs, port, lambda c: bool(c.ping()), "did not answer")
            addrs = [f"127.0.0.1:{port}" for port in self.ports]
            subprocess.run(
                [
                    "redis-cli",
                    "--cluster",
                    "create",
                    *addrs,
                    "--cluster-replicas",
                    "0",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            for port in self.ports:
                wait_ready(self.procs, port, _cluster_ok, "did not reach cluster_state:ok")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


async def masters(url: str) -> list[redis.asyncio.Redis]:
    """One plain client per master of the cluster at ``url``."""
    host, port, user, password = first_node(url)
    cluster = redis.asyncio.RedisCluster(host=host, port=port, username=user, password=password)
    try:
        await cluster.initialize()
        nodes = [(n.host, int(n.port)) for n in cluster.get_primaries()]
    finally:
        await cluster.aclose()
    return [redis.asyncio.Redis(host=h, port=p, username=user, password=password) for h, p in nodes]


async def delete_cluster_keys(clients: list[redis.asyncio.Redis], run_id: str) -> int:
    """Delete this run's keys from every master (one DEL per key: keys of many slots)."""
    deleted = 0
    for client in clients:
        batch = [key async for key in client.scan_iter(match=f"*{run_id}*", count=1000)]
        for i in range(0, len(batch), 500):
            async with client.pipeline(transaction=False) as pipe:
                for key in batch[i : i + 500]:
                    pipe.delete(key)
                deleted += sum(int(n) for n in await pipe.execute())
    return deleted
