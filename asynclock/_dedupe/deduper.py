"""Deduper: "first time I see this event id", across processes, within a TTL."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

from asynclock._cancel import finish_despite_cancellation
from asynclock._dedupe.claim import LeaseKeeper
from asynclock._errors import StateUnavailableError
from asynclock._validate import check_key, check_ttl

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock.state._protocol import State

logger = logging.getLogger("asynclock")


@final
class Deduper:
    """Answers "have I seen this id before?" atomically across every process sharing a state.

    When to use which:

    * :meth:`first_seen` records the id at once and for good (until ``ttl``): use it when
      handling the event cannot fail, or when a failed event must not be retried.
    * :meth:`claim` records it too, but forgets it again if the body raises (or is cancelled),
      so the platform's redelivery of a failed event is processed instead of being dropped as
      a duplicate. This is the right default for webhook handlers.
    * A Deduper is not a lock: two *different* events of one conversation still run
      concurrently. Combine it with :class:`AsyncLock` (or use ``EventDispatcher``).

    Invariants: ``first_seen(id)`` is ``True`` exactly once per id per ``ttl`` window, across
    every client of the state (atomic set-if-absent on the server, expiry by its clock).

    Args:
        state: where the records live.
        ttl: seconds an id is remembered; make it longer than the platform's redelivery window
            (Slack retries for minutes, Telegram for a day).
        namespace: keeps the records of different uses apart.
        lease: seconds a :meth:`claim` stays "in progress" without renewal: the longest a
            crashed worker's claim can hide a redelivery (capped at ``ttl``).

    Example:
        >>> import asyncio, asynclock
        >>> async def main():
        ...     dedupe = asynclock.Deduper(asynclock.MemoryState(), ttl=60.0)
        ...     return [await dedupe.first_seen("evt-1"), await dedupe.first_seen("evt-1")]
        >>> asyncio.run(main())
        [True, False]
    """

    __slots__ = ("_lease", "_namespace", "_state", "_ttl")

    def __init__(
        self,
        state: State,
        ttl: float = 600.0,
        namespace: str = "dedupe",
        *,
        lease: float = 30.0,
    ) -> None:
        self._state = state
        self._ttl = check_ttl(ttl)
        self._namespace = check_key(namespace, "namespace")
        self._lease = min(check_ttl(lease, "lease"), self._ttl)

    def __repr__(self) -> str:
        return f"<Deduper namespace={self._namespace!r} ttl={self._ttl} state={self._state!r}>"

    @property
    def ttl(self) -> float:
        """Seconds an id is remembered."""
        return self._ttl

    @property
    def namespace(self) -> str:
        """The namespace the ids live in."""
        return self._namespace

    def _key(self, event_id: str) -> str:
        return f"{self._namespace}:{check_key(event_id, 'event id')}"

    async def first_seen(self, event_id: str) -> bool:
        """Record ``event_id``; ``True`` if it was not recorded yet (within ``ttl``)."""
        return await self._state.dedupe_add(self._key(event_id), self._ttl)

    async def forget(self, event_id: str) -> bool:
        """Forget ``event_id`` so it is processed again; ``True`` if it was recorded."""
        return await self._state.dedupe_forget(self._key(event_id))

    @property
    def lease(self) -> float:
        """Seconds an "in progress" claim lives without renewal (see :meth:`claim`)."""
        return self._lease

    @asynccontextmanager
    async def claim(self, event_id: str) -> AsyncIterator[bool]:
        """Claim ``event_id`` for the block, in two phases; forget it if the block fails.

        Yields ``True`` for a fresh id and ``False`` for a duplicate (the body should then skip
        the work). A fresh claim is first recorded as *in progress* for ``lease`` seconds and
        renewed every ``lease/3`` while the block runs; when the block succeeds it becomes
        *done* for the full ``ttl``. If the block raises or is cancelled, the id is forgotten
        so a redelivery is processed; if the process dies, the claim lapses after at most
        ``lease`` seconds instead of hiding the redelivery for the whole ``ttl``. A duplicate's
        record is never touched by this block.
        """
        key = self._key(event_id)
        fresh = await self._state.dedupe_add(key, self._lease)
        if not fresh:
            yield False
            return
        keeper = LeaseKeeper(self._state, key, self._lease)
        try:
            yield True
        except BaseException:
            await finish_despite_cancellation(self._forget_after_failure(keeper, event_id))
            raise
        await keeper.stop()
        try:
            await self._state.dedupe_keep(key, self._ttl)  # done: remembered for the full ttl
        except StateUnavailableError as exc:
            # the work is done; the id stays claimed for its lease, after which a redelivery
            # would run again (at least once, never lost)
            logger.warning("asynclock: could not mark %r done: %s", event_id, exc)

    async def _forget_after_failure(self, keeper: LeaseKeeper, event_id: str) -> None:
        await keeper.stop()
        try:
            await self._state.dedupe_forget(keeper.key)
        except Exception:
            logger.warning(
                "asynclock: could not forget dedupe id %r after a failure; a redelivery will "
                "look like a duplicate until its lease runs out",
                event_id,
                exc_info=True,
            )
