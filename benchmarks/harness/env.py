"""Run configuration, the lazily imported asynclock API, Redis helpers and version facts."""

from __future__ import annotations

import asyncio
import datetime as _dt
import importlib
import importlib.metadata
import ipaddress
import os
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import urlsplit

import redis.asyncio

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


REPO = Path(__file__).resolve().parents[2]
DEFAULT_URL = "redis://127.0.0.1:6379/0"
KEY_ROOT = "asynclock-bench"


@dataclass
class Config:
    url: str = DEFAULT_URL
    quick: bool = False
    rounds: int | None = None
    #: ``--write``: a scenario that keeps a record of its own (``inbox-scale``) stores it
    write: bool = False
    run_id: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")

    def rounds_or(self, default: int, quick: int) -> int:
        if self.rounds is not None:
            return self.rounds
        return quick if self.quick else default

    def key(self, *parts: str) -> str:
        """A key name of this run (asynclock adds its own ``prefix``; peers use it as is)."""
        return ":".join([KEY_ROOT, self.run_id, *parts])

    @property
    def prefix(self) -> str:
        return "bench:"


def is_loopback_url(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return True
    host = parts.hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_LOG_SINK: list[Callable[[str], None]] = []


def set_log_sink(sink: Callable[[str], None] | None) -> None:
    """Route :func:`log` through ``sink`` (the rich display of ``_progress``); None: plain."""
    _LOG_SINK[:] = [sink] if sink is not None else []


def log(message: str) -> None:
    """Progress goes to stderr so that stdout stays a clean markdown report."""
    if _LOG_SINK:
        _LOG_SINK[0](message)
        return
    print(message, file=sys.stderr, flush=True)


def short(label: str) -> str:
    """A variant's label for progress lines: no markdown, no parenthesised detail."""
    return label.replace("**", "").split(" (")[0]


# --- asynclock, imported lazily -------------------------------------------------------------


class LockLike(Protocol):
    def acquire(self) -> Awaitable[bool]: ...
    def release(self) -> Awaitable[None]: ...


class StateLike(Protocol):
    def aclose(self) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Asynclock:
    """The parts of asynclock the benchmarks use, reached through ``Any`` on purpose.

    The library is written alongside these benchmarks; going through ``importlib`` keeps
    ``mypy benchmarks`` independent of its state and lets a broken import skip rows instead of
    failing the run.
    """

    module: Any
    version: str

    def redis_state(self, url: str, prefix: str) -> StateLike:
        return cast("StateLike", self.module.RedisState.from_url(url, prefix=prefix))

    def memory_state(self) -> StateLike:
        return cast("StateLike", self.module.MemoryState())

    def lock(self, state: StateLike, key: str, ttl: float = 30.0) -> LockLike:
        return cast("LockLike", self.module.AsyncLock(state, key, ttl=ttl))

    def lock_factory(self) -> Any:
        """``AsyncLock`` itself, for hot loops that should not pay for an extra call."""
        return self.module.AsyncLock


def require_asynclock() -> Asynclock:
    """The asynclock API; raises whatever importing it raises."""
    module = importlib.import_module("asynclock")
    for name in ("AsyncLock", "RedisState", "MemoryState"):
        getattr(module, name)
    version = getattr(module, "__version__", None) or dist_version("asynclock")
    return Asynclock(module, str(version))


def load_asynclock() -> Asynclock | str:
    """The asynclock API, or the reason it cannot be used (then its rows are skipped)."""
    try:
        return require_asynclock()
    except Exception as exc:  # noqa: BLE001 (reported, never fatal)
        return f"asynclock not importable ({type(exc).__name__}: {exc})"


# --- Redis helpers ----------------------------------------------------------------------------

RELEASE_SCRIPT = """
if redis.call("get", KEYS[1]) == ARGV[1] then
    return redis.call("del", KEYS[1])
else
    return 0
end
"""


class CommandCounter:
    """Commands the server processed between :meth:`start` and :meth:`stop`.

    From ``INFO stats`` total_commands_processed; a reading counts the previous INFO call but
    not itself, so one INFO is taken off the difference. The server is shared: other clients'
    commands are counted too (the asyncio.Lock rows show how many that was).
    """

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self.client = client
        self.begin = 0

    async def _read(self) -> int:
        info = await self.client.info("stats")
        return int(info["total_commands_processed"])

    async def start(self) -> None:
        self.begin = await self._read()

    async def stop(self) -> int:
        return await self._read() - self.begin - 1


async def delete_run_keys(client: redis.asyncio.Redis, run_id: str) -> int:
    """Delete every key this run created (peers' and asynclock's); returns how many."""
    deleted = 0
    batch: list[Any] = []
    async for key in client.scan_iter(match=f"*{run_id}*", count=1000):
        batch.append(key)
        if len(batch) >= 500:
            deleted += int(await client.delete(*batch))
            batch.clear()
    if batch:
        deleted += int(await client.delete(*batch))
    return deleted


# --- versions -----------------------------------------------------------------------------------


def dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def commit(changed: str = " + uncommitted changes") -> str:
    """HEAD's short hash, and ``changed`` when asynclock/ has uncommitted changes."""
    dirty = git("status", "--porcelain", "--", "asynclock")
    return git("rev-parse", "--short", "HEAD") + (changed if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def optional(module: str, package: str) -> Any | str:
    """``module`` imported, or why not (a peer library this run has not installed)."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        return f"{package} not installed ({exc}); pip install {package}"


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def environment_facts(
    client: redis.asyncio.Redis | None, url: str, api: Asynclock | str
) -> list[tuple[str, str]]:
    """The facts printed at the top of the report."""
    server = "not reached"
    if client is not None:
        try:
            info = await client.info("server")
            server = f"{info.get('redis_version')} ({info.get('multiplexing_api')})"
        except Exception as exc:  # noqa: BLE001 (reported, never fatal)
            server = f"unknown ({type(exc).__name__})"
    if isinstance(api, str):
        lock_version = api
    else:
        where = Path(getattr(api.module, "__file__", "?")).parent
        shown = where.relative_to(REPO) if where.is_relative_to(REPO) else where
        lock_version = f"{api.version} from {shown}/"
    return [
        ("date", now_utc()),
        (
            "machine",
            f"{os.cpu_count()} CPU ({_cpu_model()}), {_mem_total()}, {platform.platform()}",
        ),
        ("python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("event loop", "asyncio default (selector); no uvloop"),
        ("state", redact(url)),
        ("redis-server", server),
        ("redis-py", dist_version("redis")),
        ("hiredis", dist_version("hiredis")),
        ("python-redis-lock", dist_version("python-redis-lock")),
        ("pottery", dist_version("pottery")),
        (
            "asynclock",
            f"{lock_version}, git {commit(' + uncommitted changes in asynclock/')}",
        ),
    ]


async def general_facts(cfg: Config, api: Asynclock | str) -> list[tuple[str, str]]:
    """Machine, Python, asynclock and Redis facts: the part of :func:`environment_facts` that
    scenarios with their own environment block repeat."""
    client = redis.asyncio.Redis.from_url(cfg.url)
    try:
        general = await environment_facts(client, cfg.url, api)
    finally:
        await client.aclose()
    wanted = {"machine", "python", "event loop", "asynclock", "redis-server"}
    out = [(k, v) for k, v in general if k in wanted]
    return [*out, ("Redis server URL", redact(cfg.url))]


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return parts._replace(netloc=netloc).geturl()
    return url


async def background_rate(client: redis.asyncio.Redis, seconds: float = 0.5) -> float:
    """Commands per second other clients send to the server while this run is idle."""
    counter = CommandCounter(client)
    await counter.start()
    t0 = time.perf_counter()
    await asyncio.sleep(seconds)
    commands = await counter.stop()
    return commands / (time.perf_counter() - t0)
