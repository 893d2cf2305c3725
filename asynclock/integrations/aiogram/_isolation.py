"""``EventIsolation``: aiogram's ``events_isolation`` on an :class:`~asynclock.AsyncLock`.

aiogram's FSM middleware wraps the handling of every update in
``async with dispatcher.events_isolation.lock(key)`` (``key`` a ``StorageKey``: bot, chat, user,
topic; the FSM state is read inside, after the lock is taken, aiogram#1317). aiogram ships two
isolations: ``SimpleEventIsolation`` (one ``asyncio.Lock`` per key, in one process, kept forever)
and ``RedisEventIsolation`` (redis-py's ``Lock`` with ``timeout=60``: polled every 0.1 s, not in
order, never renewed, so a handler running past 60 s loses its isolation silently). This one is
an :class:`~asynclock.AsyncLock` per update, on any state.
"""

from __future__ import annotations

import contextvars
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, final

from aiogram.fsm.storage.base import BaseEventIsolation, DefaultKeyBuilder, KeyBuilder

from asynclock import AsyncLock, State, state_from_url
from asynclock._validate import check_seconds, check_ttl

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from aiogram.fsm.storage.base import StorageKey

__all__ = ("EventIsolation", "isolation_token")

#: the fencing token of the isolation lock the current update's handling holds
_token: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "asynclock_aiogram_isolation_token", default=None
)


def isolation_token() -> int | None:
    """The fencing token of the :class:`EventIsolation` lock this update is handled under.

    ``None`` outside such a handling. Pass it to the store the handler writes to, so that the
    write of a handler whose lock was taken over (it ran past its TTL while the state was
    unreachable) is refused.
    """
    return _token.get()


@final
class EventIsolation(BaseEventIsolation):
    """aiogram's ``events_isolation`` with asynclock's locks: ``Dispatcher(events_isolation=...)``.

    A drop-in for aiogram's ``RedisEventIsolation`` on every built-in state (memory, Redis and
    Redis Cluster, PostgreSQL, MySQL/MariaDB). aiogram asks for the lock of an update's FSM key
    (per user in chat by default, ``Dispatcher(fsm_strategy=...)``) around its handling.

    Invariants:

    * At most one update per key is handled at any time, across every process sharing the
      state. Another update of the key waits for it: woken by the release (pub/sub,
      LISTEN/NOTIFY, MySQL's named-lock bell), not by polling; the waiters of one process are
      served in arrival order, and every waiting process gets its turn.
    * The lock is renewed every ``ttl / 3`` while the handler runs, however long it runs. If it
      is lost anyway (the state unreachable for ``ttl``), the handler is cancelled and aiogram
      gets :class:`~asynclock.LockLostError`.
    * Fenced: :func:`isolation_token` gives the handler its lock's fencing token, strictly
      increasing per key.
    * Nothing is kept per key: not in this object, and not in the state beyond what a released
      lock leaves (a fencing-token memory that expires, see the backends' ``token_retention``).
      A process killed mid-update frees its key after ``ttl``.

    Args:
        state: where the locks live; every process of the bot must share it.
        ttl: seconds a lock lives between renewals (how long a dead process blocks its keys).
        timeout: seconds an update waits for its key at most, then ``LockAcquisitionError``
            goes to aiogram (``None``: as long as it takes).
        key_builder: how a ``StorageKey`` becomes a lock key (default: aiogram's
            ``DefaultKeyBuilder`` with the bot id, the business connection and the destiny, under
            the prefix ``aiogram``).
    """

    def __init__(
        self,
        state: State,
        *,
        ttl: float = 30.0,
        timeout: float | None = None,
        key_builder: KeyBuilder | None = None,
    ) -> None:
        if not isinstance(state, State):
            raise TypeError(f"EventIsolation needs an asynclock state, got {state!r}")
        if key_builder is not None and not isinstance(key_builder, KeyBuilder):
            raise TypeError(f"key_builder must be an aiogram KeyBuilder, got {key_builder!r}")
        self._state = state
        self._ttl = check_ttl(ttl)
        self._timeout = check_seconds(timeout, "timeout", allow_zero=True, allow_none=True)
        self._keys = key_builder or DefaultKeyBuilder(
            prefix="aiogram", with_bot_id=True, with_business_connection_id=True, with_destiny=True
        )
        self._owns_state = False

    @classmethod
    def from_url(cls, url: str, *, ttl: float = 30.0, **options: object) -> EventIsolation:
        """An isolation on the state at ``url`` (``state_from_url(url, **options)``), which it
        owns: aiogram's shutdown (``close()``) closes it."""
        isolation = cls(state_from_url(url, **options), ttl=ttl)
        isolation._owns_state = True
        return isolation

    def __repr__(self) -> str:
        return f"<EventIsolation ttl={self._ttl} state={self._state!r}>"

    @property
    def state(self) -> State:
        """The state the locks live in."""
        return self._state

    def lock_key(self, key: StorageKey) -> str:
        """The lock key of aiogram's ``key``."""
        return self._keys.build(key, "lock")

    @asynccontextmanager
    async def lock(self, key: StorageKey) -> AsyncGenerator[None, None]:
        """Hold ``key``'s lock for the block: wait for it, renew it, release it on the way out."""
        async with AsyncLock(
            self._state, self.lock_key(key), ttl=self._ttl, timeout=self._timeout, auto_renew=True
        ) as held:
            fenced = _token.set(held.token)
            try:
                yield
            finally:
                _token.reset(fenced)

    async def close(self) -> None:
        """Called by aiogram's shutdown: close the state if :meth:`from_url` made it."""
        if self._owns_state:
            await self._state.aclose()
