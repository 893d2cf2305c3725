"""Clean-up that must finish although the task running it is being cancelled.

A cancelled acquire or release may leave a lock granted on the server with nobody to release it.
These helpers run the undoing step to its end (or in the background when nobody waits for it),
and log rather than raise its failure, since the caller is already propagating an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Coroutine

logger = logging.getLogger("asynclock")


async def finish_despite_cancellation(work: Coroutine[object, object, object]) -> None:
    """Run clean-up ``work`` to its end even if the calling task is cancelled (again) meanwhile.

    Failures are logged, not raised: the caller is already propagating an exception. Backends
    bound every operation by their timeout, so this cannot hang.
    """
    task = asyncio.ensure_future(work)
    while not task.done():
        # asyncio.wait never cancels the task it waits for, and raises only CancelledError
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((task,))
    _log_failure(task)


async def clean_up(work: Coroutine[object, object, object], *, wait: bool) -> None:
    """Run clean-up ``work``: to its end despite cancellation, or in the background."""
    if wait:
        await finish_despite_cancellation(work)
    else:
        run_in_background(work)


def run_in_background(work: Coroutine[object, object, object]) -> None:
    """Run clean-up ``work`` without waiting for it; failures are logged."""
    task = asyncio.get_running_loop().create_task(work)
    task.add_done_callback(_log_failure)


def _log_failure(task: asyncio.Future[object]) -> None:
    if not task.done() or task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        logger.warning(
            "asynclock: background clean-up failed (the lock expires by its TTL): %r", exc
        )
