"""Version shims, kept in one place."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline_after
    from asyncio import timeout_at as deadline_at
else:  # pragma: no cover - exercised on 3.10 only
    from async_timeout import timeout as deadline_after  # type: ignore[import-not-found,unused-ignore]
    from async_timeout import timeout_at as deadline_at  # type: ignore[import-not-found,unused-ignore]

__all__ = ["deadline_after", "deadline_at"]
