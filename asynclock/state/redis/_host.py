"""The part of RedisState its mixins (:class:`RedisInbox`, :class:`RedisSemaphores`) run scripts
through: what RedisState supplies, and the replica-confirmed runs they share with it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock.state.redis._scripts import as_int

if TYPE_CHECKING:
    from asynclock._errors import StateUnavailableError

__all__ = ["ScriptHost"]


class ScriptHost:
    """Base of RedisState and its mixins: script runs with ``replicas=N`` confirmation."""

    __slots__ = ()

    # what RedisState supplies
    _replicas: int

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
