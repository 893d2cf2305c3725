"""State URLs: the static scheme table and password-free rendering.

``state_from_url`` looks the scheme up in :data:`SCHEMES` (a plain table, greppable and typed,
instead of registration on import) and imports the backend lazily, so ``import asynclock``
never needs redis-py, asyncpg or aiomysql.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from asynclock.state._protocol import State

#: scheme -> ("module:Class", extra that installs its driver)
SCHEMES: dict[str, tuple[str, str | None]] = {
    "memory": ("asynclock.state.memory:MemoryState", None),
    "redis": ("asynclock.state.redis:RedisState", "redis"),
    "rediss": ("asynclock.state.redis:RedisState", "redis"),
    "unix": ("asynclock.state.redis:RedisState", "redis"),
    "redis+cluster": ("asynclock.state.redis:RedisState", "redis"),
}


@dataclass(frozen=True, slots=True)
class StateURL:
    """A parsed state URL whose ``repr``/``str`` never shows the password."""

    url: str

    @property
    def scheme(self) -> str:
        """The URL scheme, lower-cased (``"redis"``, ``"memory"``, ...)."""
        return self.url.partition("://")[0].lower() if "://" in self.url else ""

    def redacted(self) -> str:
        """The URL with any password replaced by ``***``."""
        return redact(self.url)

    def __repr__(self) -> str:
        return f"StateURL({self.redacted()!r})"

    def __str__(self) -> str:
        return self.redacted()


def redact(url: str) -> str:
    """Return ``url`` with the password (if any) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" if user else f":***@{host}"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def backend_class(url: str) -> type[State]:
    """The state class that serves ``url``'s scheme; ``ValueError`` naming the known schemes."""
    if not isinstance(url, str):
        raise TypeError(f"state URL must be a str, got {type(url).__name__}")
    scheme = StateURL(url).scheme
    if scheme not in SCHEMES:
        known = ", ".join(f"{name}://" for name in SCHEMES)
        raise ValueError(f"unknown state URL scheme in {redact(url)!r}: known schemes are {known}")
    target, extra = SCHEMES[scheme]
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (pip install 'asynclock[{extra}]')" if extra else ""
        raise ImportError(f"the {scheme}:// state needs its driver{hint}: {exc}") from exc
    cls: type[State] = getattr(module, class_name)
    return cls
