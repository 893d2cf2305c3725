"""Version shims, kept in one place."""

from __future__ import annotations

import asyncio
import contextlib
import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout as deadline_after
    from asyncio import timeout_at as deadline_at
else:  # pragma: no cover - exercised on 3.10 only
    from async_timeout import timeout as deadline_after  # type: ignore[import-not-found,unused-ignore]
    from async_timeout import timeout_at as deadline_at  # type: ignore[import-not-found,unused-ignore]

__all__ = ["deadline_after", "deadline_at", "wait_set"]


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait at most ``timeout`` seconds for ``event``; whether it is set.

    Not ``asyncio.wait_for``: before Python 3.12, a cancellation that arrives as the event is set
    is lost there (``wait_for`` returns the result and the cancelled task runs on), which left a
    worker's ear listening after ``serve()`` was told to stop. A deadline keeps the cancellation.
    """
    if event.is_set():
        return True
    with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
        async with deadline_after(timeout):
            await event.wait()
    return event.is_set()
