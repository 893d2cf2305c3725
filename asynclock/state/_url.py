"""State URLs: the scheme table and password-free rendering.

``state_from_url`` looks the scheme up in :data:`SCHEMES` (built from the backend table of
``_backends.py``, instead of registration on import) and imports the backend lazily, so
``import asynclock`` never needs redis-py, asyncpg or aiomysql.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from asynclock.state._backends import BACKENDS

if TYPE_CHECKING:
    from asynclock.state._protocol import State

#: scheme -> ("module:Class", extra that installs its driver): the backend table's schemes
#: (:data:`asynclock.state._backends.BACKENDS`), then those of :func:`register_scheme`
SCHEMES: dict[str, tuple[str, str | None]] = {
    scheme: (backend.target, backend.extra) for backend in BACKENDS for scheme in backend.schemes
}


def register_scheme(scheme: str, target: str, extra: str | None = None) -> None:
    """Let :func:`state_from_url` build your own state class for ``scheme://`` URLs.

    Args:
        scheme: the URL scheme, e.g. ``"etcd"``; an existing one is replaced.
        target: ``"package.module:ClassName"``, imported on first use; the class needs a
            ``from_url(url, **options)`` class method.
        extra: the pip extra (or package) that installs its driver, named in import errors.

    Example:
        >>> from asynclock.state import register_scheme, state_from_url
        >>> register_scheme("mem2", "asynclock.state.memory:MemoryState")
        >>> state_from_url("mem2://")
        <MemoryState locks=0 dedupe=0>
    """
    if not isinstance(scheme, str) or not scheme or "://" in scheme:
        raise ValueError(f"scheme must be a bare URL scheme like 'etcd', got {scheme!r}")
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError(f"target must read 'package.module:ClassName', got {target!r}")
    SCHEMES[scheme.lower()] = (target, extra)


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


_SECRET_PARAMS = re.compile(r"(?i)(^|[&;])((?:password|passwd|pass|pwd)=)[^&;]*")


def redact(url: str) -> str:
    """Return ``url`` with any password (user info or ``?password=``) replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    query = _SECRET_PARAMS.sub(r"\1\2***", parts.query)
    if netloc == parts.netloc and query == parts.query:
        return url
    # built by hand: urlunsplit would turn "unix:///path" into "unix:/path"
    text = f"{parts.scheme}://{netloc}{parts.path}"
    if query:
        text += f"?{query}"
    if parts.fragment:
        text += f"#{parts.fragment}"
    return text


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
