"""Leaving ``async with`` of a held lock or permit: the release, and what its failure means.

Shared by the lock's engine (``Hold.exit``, behind :class:`~asynclock.AsyncLock`'s ``__aexit__``)
and :class:`~asynclock.Semaphore`'s ``__aexit__``, which report a loss the same way: what differs
(how each releases, what it forgets) comes in as callables.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from asynclock._errors import LockLostError, LockNotOwnedError, StateUnavailableError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = ["release_on_exit"]

logger = logging.getLogger("asynclock")


async def release_on_exit(
    release: Callable[[], Awaitable[None]],
    forget: Callable[[], None],
    *,
    what: str,
    key: str,
    owner: str,
    body_failed: bool,
    lost_while_held: bool,
) -> None:
    """Run ``release()`` at the end of an ``async with`` body, translating its failure.

    * ``LockNotOwnedError`` (the lock or permit had expired): when the body ended normally and
      nobody saw the loss yet, the body ran past its life: raise :class:`LockLostError` (what
      ``async with`` reports; an explicit ``release()`` says "not owned"); else log it.
    * ``StateUnavailableError``: re-raised, unless the loss was seen already (the renewer gave
      it up because the state stayed unreachable until the TTL ran out): then ``forget()`` and
      log it, since what the caller must learn is the loss, not the outage (the release goes on
      in the background).

    ``what`` names the thing in log messages (``"lock"``, ``"permit of semaphore"``).
    """
    try:
        await release()
    except LockNotOwnedError as not_owned:
        if not body_failed and not lost_while_held:
            raise LockLostError(key, owner) from not_owned
        logger.warning(
            "asynclock: %s %r had expired before its body finished",
            what,
            key,
            extra={"lock_key": key, "owner": owner},
        )
    except StateUnavailableError:
        if not lost_while_held:
            raise
        forget()
        logger.warning(
            "asynclock: %s %r was lost during an outage; its release did not get through",
            what,
            key,
            extra={"lock_key": key, "owner": owner},
        )
