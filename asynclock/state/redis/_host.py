"""The part of RedisState its mixins (:class:`RedisInbox`, :class:`RedisSemaphores`) run scripts
and watch channels through: what RedisState supplies, and the replica-confirmed runs and the
pub/sub watches they share with it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, TypeVar

from asynclock.state._watch import EventWatch
from asynclock.state.redis._scripts import as_int

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock._errors import StateUnavailableError
    from asynclock.state._guard import OperationGuard
    from asynclock.state.redis._subscriber import ShardedSubscriber, Subscriber
    from asynclock.state.redis._transport import Transport

W = TypeVar("W", bound=EventWatch)

__all__ = ["ScriptHost"]


class ScriptHost:
    """Base of RedisState and its mixins: script runs with ``replicas=N`` confirmation, and
    watches on pub/sub channels."""

    # what RedisState supplies
    _replicas: int
    _op_timeout: float | None
    _guard: OperationGuard
    _transport: Transport
    _subscriber: Subscriber | ShardedSubscriber | None

    if TYPE_CHECKING:

        def lock_key(self, key: str) -> str: ...

        async def _eval(
            self, name: str, keys: tuple[str, ...], *args: str | int, idempotent: bool = False
        ) -> object: ...

        async def _eval_waited(
            self, name: str, keys: tuple[str, ...], *args: str | int
        ) -> tuple[object, int | None]: ...

        def _short(self, acks: int | None, what: str) -> StateUnavailableError | None: ...

    async def _eval_confirmed(
        self, name: str, keys: tuple[str, ...], args: tuple[str | int, ...], what: str
    ) -> object:
        """:meth:`_eval`; with ``replicas=N``, :meth:`_eval_waited`, a shortfall raising."""
        if not self._replicas:
            return await self._eval(name, keys, *args)
        reply, acks = await self._eval_waited(name, keys, *args)
        error = self._short(acks, what)
        if error is not None:
            raise error
        return reply

    async def _eval_extended(
        self, name: str, keys: tuple[str, ...], args: tuple[str | int, ...], what: str
    ) -> bool:
        """Run the extend script ``name`` (replying 1 when it extended): whether it extended;
        with ``replicas=N`` a shortfall raises, but only for an extend that happened."""
        if not self._replicas:
            return as_int(await self._eval(name, keys, *args, idempotent=True)) == 1
        reply, acks = await self._eval_waited(name, keys, *args)
        if as_int(reply) != 1:
            return False
        error = self._short(acks, what)
        if error is not None:
            raise error
        return True

    @contextlib.asynccontextmanager
    async def _watching(
        self,
        channel: bytes,
        watch: W,
        subscriber: Subscriber | ShardedSubscriber | None = None,
    ) -> AsyncIterator[W]:
        """``watch`` hears the messages on ``channel`` while the block runs, on ``subscriber``
        (by default the state's own pub/sub connection, opened on first use)."""
        if subscriber is None:
            if self._subscriber is None:
                self._subscriber = self._transport.subscriber(self._op_timeout or 5.0)
            subscriber = self._subscriber
        async with self._guard():
            await subscriber.add(channel, watch)
        try:
            yield watch
        finally:
            subscriber.discard(channel, watch)
