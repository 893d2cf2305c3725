"""A throwaway ``redis-server`` of one fault test, started, stopped and restarted by it.

Each test gets its own process (see :mod:`tests.support.servers`) with nothing persisted
(``--save ""``, no AOF), or, with ``durable=True``, an append-only file fsynced on every write
(``--appendfsync always``), so a restart keeps every write it confirmed (the durable inbox's
soak).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

from tests.support.servers import RedisProcess


class RedisServer(RedisProcess):
    """One ``redis-server`` process on ``127.0.0.1:port``; :meth:`restart` keeps the port."""

    def __init__(self, binary: str, port: int | None = None, *, durable: bool = False) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="asynclock-faults-")
        volatile = ("--save", "", "--appendonly", "yes" if durable else "no")
        super().__init__(
            binary, Path(self._dir.name), *volatile, "--appendfsync", "always", port=port
        )
        self.durable = durable

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, log: Path | None = None) -> None:
        """Start the server (a log file per start) and wait until it answers PING."""
        super().start(log or self.folder / f"redis-{self.starts}.log")

    def restart(self, *, kill: bool = False) -> None:
        """Stop the server and start a new one on the same port (its data is gone, unless
        ``durable``: then it reloads its append-only file)."""
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        self.stop(kill=True)
        with contextlib.suppress(OSError):
            self._dir.cleanup()
