"""Version shims, kept in one place."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline_after
    from asyncio import timeout_at as deadline_at
else:  # pragma: no cover - exercised on 3.10 only
    from async_timeout import timeout as deadline_after
    from async_timeout import timeout_at as deadline_at

__all__ = ["deadline_after", "deadline_at"]
