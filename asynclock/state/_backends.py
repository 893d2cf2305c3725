"""The backend table: every state class asynclock ships, in one place.

A new backend is one row here (and its package under ``asynclock/state/``). Everything that
must agree on the backends reads this table instead of keeping its own list:

* :func:`asynclock.state.state_from_url` (through :data:`asynclock.state._url.SCHEMES`, built
  from :attr:`Backend.schemes`) chooses the class by the URL's scheme;
* the lazy imports of ``asynclock`` and ``asynclock.state`` (a server state loads its driver
  only when first named) and their ``__all__``;
* the test matrix (``tests/_matrix.py``), which runs each backend and checks that the class
  implements every capability its row claims (``tests/unit/test_backends.py``).

Nothing here imports a backend: the rows name modules, imported on first use, so
``import asynclock`` never needs redis-py, asyncpg or aiomysql.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("BACKENDS", "CAPABILITIES", "Backend", "lazy")

#: the capability protocols of ``asynclock.state._protocol`` a backend may implement, beyond
#: :class:`~asynclock.state.State` itself (``docs/custom-backends.md`` says what each one is for)
CAPABILITIES = (
    "ClaimingState",
    "DedupeReading",
    "InboxState",
    "FairState",
    "SemaphoreState",
    "LockAdmin",
    "DurabilityCheck",
    "SupersedeSignals",
)


@dataclass(frozen=True, slots=True)
class Backend:
    """One state class: where it lives, which URLs build it, what it can do."""

    #: the class's name, exported from ``asynclock`` and ``asynclock.state``
    name: str
    #: the module that defines it (imported lazily for a server state)
    module: str
    #: the URL schemes :func:`~asynclock.state.state_from_url` builds it for
    schemes: tuple[str, ...]
    #: the pip extra that installs its driver (``None``: nothing to install)
    extra: str | None
    #: the capability protocols it implements (names from :data:`CAPABILITIES`)
    capabilities: tuple[str, ...]

    @property
    def target(self) -> str:
        """``"package.module:ClassName"``, as :func:`~asynclock.state.register_scheme` takes."""
        return f"{self.module}:{self.name}"


BACKENDS: tuple[Backend, ...] = (
    Backend(
        "MemoryState",
        "asynclock.state.memory",
        ("memory",),
        None,
        (
            "ClaimingState",
            "DedupeReading",
            "InboxState",
            "FairState",
            "SemaphoreState",
            "LockAdmin",
            "SupersedeSignals",
        ),
    ),
    Backend(
        "RedisState",
        "asynclock.state.redis",
        ("redis", "rediss", "unix", "redis+cluster", "redis+sentinel"),
        "redis",
        CAPABILITIES,
    ),
    Backend(
        "PostgresState",
        "asynclock.state.postgres",
        ("postgresql", "postgres"),
        "postgres",
        (
            "ClaimingState",
            "DedupeReading",
            "InboxState",
            "SemaphoreState",
            "LockAdmin",
            "SupersedeSignals",
        ),
    ),
    Backend(
        "MySQLState",
        "asynclock.state.mysql",
        ("mysql",),
        "mysql",
        ("DedupeReading", "InboxState", "SemaphoreState", "LockAdmin", "SupersedeSignals"),
    ),
)


def lazy(name: str) -> Backend | None:
    """The row of a server state loaded on first use (``None``: no such lazy name)."""
    for backend in BACKENDS:
        if backend.name == name and backend.extra is not None:
            return backend
    return None
