"""The semaphores of RedisState (:class:`~asynclock.state.SemaphoreState`), as a mixin.

Each operation is one EVALSHA of a ``semaphore_*.lua`` script of this folder (after the
``_semaphore.lua`` prelude), so it is atomic against every client and expires permits by the
server's ``TIME``. A semaphore's keys hang off its key's lock key, ``P{key}:semaphore:*``, so
they share the key's hash tag and a script runs whole on the master owning that slot of a
Redis Cluster. The wake channel (``P{key}:semaphore:wake``) carries the owners a release made
eligible; each waiter's :class:`~asynclock.state._watch.OwnerWatch` wakes only for its own
(sharded pub/sub on a cluster, as the lock's release channel).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from asynclock._errors import StateUnavailableError
from asynclock._validate import check_key, check_permits, check_ttl, ttl_ms
from asynclock.state._protocol import Grant, LockInfo, SemaphoreInfo
from asynclock.state._watch import OwnerWatch
from asynclock.state.redis._host import ScriptHost
from asynclock.state.redis._scripts import as_int, text

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


__all__ = ["RedisSemaphores"]


class RedisSemaphores(ScriptHost):
    """The :class:`~asynclock.state.SemaphoreState` operations of RedisState (see the module)."""

    # what RedisState supplies
    _retention_ms: int

    if TYPE_CHECKING:

        @property
        def replicas(self) -> int: ...

    def _semaphore_keys(self, key: str) -> tuple[str, ...]:
        """Holders, tokens, meta, queue, places, limits and the wake channel (one slot)."""
        base = f"{self.lock_key(check_key(key))}:semaphore"
        return tuple(f"{base}:{part}" for part in _PARTS)

    def _mark_key(self, keys: tuple[str, ...], owner: str) -> str:
        return f"{keys[0].rpartition(':')[0]}:abandoned:{owner}"

    async def semaphore_acquire(
        self, key: str, owner: str, limit: int, ttl: float, *, hold: float | None = None
    ) -> Grant:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_acquire` (one EVALSHA of
        ``semaphore_acquire.lua``; with ``replicas=N``, ``WAIT`` after it as for locks)."""
        keys = self._semaphore_keys(key)
        args = (
            owner,
            check_permits(limit, key=key),
            ttl_ms(check_ttl(ttl, key=key)),
            ttl_ms(check_ttl(hold, "hold", key=key)) if hold is not None else 0,
            self._retention_ms,
        )
        everything = (*keys, self._mark_key(keys, owner))
        if self.replicas:
            reply, acks = await self._eval_waited("semaphore_acquire", everything, *args)
        else:
            reply, acks = await self._eval("semaphore_acquire", everything, *args), None
        value = as_int(reply)
        if value <= 0:
            return Grant(None, -value / 1000.0)
        error = self._short(acks, f"a permit of semaphore {key!r} was taken")
        if error is not None:
            try:
                await self.semaphore_abandon(key, owner)
            except StateUnavailableError as exc:
                raise StateUnavailableError(f"{error}; giving it back failed too ({exc})") from None
            raise StateUnavailableError(f"{error}; it was given back")
        return Grant(value)

    async def semaphore_release(self, key: str, owner: str) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_release` (one EVALSHA)."""
        return as_int(await self._eval("semaphore_release", self._semaphore_keys(key), owner)) == 1

    async def semaphore_abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_abandon` (one EVALSHA; the mark
        lives as long as an abandoned acquire may be in flight: twice the operation timeout)."""
        keys = self._semaphore_keys(key)
        mark_ms = ttl_ms(max(self._op_timeout or 0.0, 1.0) * 2)
        await self._eval("semaphore_abandon", (*keys, self._mark_key(keys, owner)), owner, mark_ms)

    async def semaphore_extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_extend` (one EVALSHA)."""
        keys = self._semaphore_keys(key)
        args = (owner, ttl_ms(check_ttl(ttl, key=key)), self._retention_ms)
        what = f"a permit of semaphore {key!r} was extended"
        return await self._eval_extended("semaphore_extend", keys, args, what)

    async def semaphore_inspect(self, key: str) -> SemaphoreInfo:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_inspect` (one read-only EVALSHA)."""
        reply = await self._eval("semaphore_inspect", self._semaphore_keys(key), idempotent=True)
        assert isinstance(reply, list)
        holders = [
            LockInfo(
                key, text(reply[i]), max(as_int(reply[i + 1]), 0) / 1000.0, as_int(reply[i + 2])
            )
            for i in range(1, len(reply), 3)
        ]
        holders.sort(key=lambda info: info.token)
        return SemaphoreInfo(key, tuple(holders), as_int(reply[0]))

    @contextlib.asynccontextmanager
    async def semaphore_watch(self, key: str, owner: str) -> AsyncIterator[OwnerWatch]:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_watch`: the key's wake channel
        on the state's one pub/sub connection, filtered for ``owner``."""
        channel = self._semaphore_keys(key)[-1].encode()
        async with self._watching(channel, OwnerWatch(asyncio.get_running_loop(), owner)) as watch:
            yield watch


_PARTS = ("holders", "tokens", "meta", "queue", "places", "limits", "wake")
