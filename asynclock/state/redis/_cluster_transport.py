"""Redis Cluster: the :class:`~asynclock.state.redis._transport.Transport` over a
:class:`~asynclock.state.redis._cluster.ClusterRouter`.

Every script touches only keys sharing the lock key's hash tag (:class:`BracedLockKeys`), so it
runs whole on the master owning that slot; release channels are sharded (``SPUBLISH`` in the
scripts, ``SSUBSCRIBE`` in :class:`~asynclock.state.redis._subscriber.ShardedSubscriber`), and
the inbox's set of keys with work is one per slot with a directory (``_cluster_inbox.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from asynclock.state.redis._cluster import ClusterRouter, slot_of
from asynclock.state.redis._cluster_inbox import SlotReadySets
from asynclock.state.redis._plain import scan_pages
from asynclock.state.redis._pool import opened
from asynclock.state.redis._subscriber import ShardedSubscriber
from asynclock.state.redis._transport import LockKeys

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Mapping

    from redis.asyncio import RedisCluster
    from redis.asyncio.connection import AbstractConnection

    from asynclock.state._guard import OperationGuard
    from asynclock.state.redis._ready import Command, ReadyIndex
    from asynclock.state.redis._transport import Args, Script

__all__ = ["BracedLockKeys", "ClusterTransport"]


class BracedLockKeys(LockKeys):
    """Redis Cluster's key layout: as :class:`LockKeys`, and a key starting with ``{`` or ``}``
    gets one more ``{`` in front (``P{{key}``).

    ``P{}x}`` would have an empty hash tag, and Redis would then hash each whole key name,
    scattering the lock's keys over different slots. The extra brace keeps the tag non-empty
    and the layout one-to-one. A script reaches the keys of one slot only.
    """

    __slots__ = ()

    def lock_key(self, key: str) -> str:
        """See :meth:`LockKeys.lock_key` (the extra brace, see the class)."""
        if key[:1] in ("{", "}"):
            return f"{self.prefix}{{{{{key}}}"
        return f"{self.prefix}{{{key}}}"

    def key_of(self, lock_key: str) -> str:
        """See :meth:`LockKeys.key_of`."""
        body = lock_key[len(self.prefix) + 1 : -1]
        return body.removeprefix("{")

    def patterns(self, match: str) -> tuple[str, ...]:
        """See :meth:`LockKeys.patterns`: also the keys starting with a brace."""
        return (*super().patterns(match), f"{self._glob}{{{{{match}}}")

    def lists(self, number: int, lock_key: str) -> bool:
        """See :meth:`LockKeys.lists`: a key starting with a brace is the second pattern's."""
        return number == 1 or not lock_key[len(self.prefix) + 1 :].startswith("{")

    def atomic_with(self, lock_key: str, name: str) -> bool:
        """See :meth:`LockKeys.atomic_with`: keys of one slot."""
        return slot_of(name) == slot_of(lock_key)


class ClusterTransport:
    """See :class:`~asynclock.state.redis._transport.Transport`: each command on the master
    owning its key's slot, ``MOVED``/``ASK`` followed (:class:`ClusterRouter`)."""

    clustered = True
    pool = None  # one pool per master, in the router

    def __init__(self, client: RedisCluster, size: int, where: str) -> None:
        """``size``: connections per master."""
        self.router = ClusterRouter(client, size)
        self.where = where

    @property
    def master(self) -> tuple[str, int] | None:
        """See :meth:`Transport.master` (not Sentinel: ``None``)."""
        return None

    def describe(self, where: str) -> str:
        """See :meth:`Transport.describe` (``cluster`` and the startup nodes)."""
        return f"cluster {where.removeprefix('Redis Cluster at ')}"

    def lock_keys(self, prefix: str) -> LockKeys:
        """See :meth:`Transport.lock_keys`."""
        return BracedLockKeys(prefix)

    async def eval(
        self, script: Script, keys: tuple[str, ...], args: Args, idempotent: bool = False
    ) -> object:
        """See :meth:`Transport.eval` (on the master of ``keys[0]``'s slot)."""
        return await self.router.call(
            slot_of(keys[0]),
            "EVALSHA",
            script.sha,
            len(keys),
            *keys,
            *args,
            retry_stale=idempotent,
            script=script.text,
        )

    async def eval_waited(
        self, script: Script, keys: tuple[str, ...], args: Args, wait: Args
    ) -> tuple[object, object]:
        """Not on a cluster: ``replicas=N`` is refused when the state is built."""
        raise NotImplementedError("replicas=N is not supported on Redis Cluster")

    async def command(self, key: str, *args: str | int | bytes) -> object:
        """See :meth:`Transport.command`."""
        return await self.router.call(slot_of(key), *args)

    async def scan(self, pattern: str) -> AsyncGenerator[list[str], None]:
        """See :meth:`Transport.scan`: every master of the slot map, one after another."""
        router = self.router
        await router.refresh()
        for address in router.masters:

            async def call(*args: str | int | bytes, on: tuple[str, int] = address) -> object:
                return await router.call_on(on, *args)

            async for page in scan_pages(call, pattern):
                yield page

    async def each_master(self, *args: str | int | bytes) -> list[tuple[str, object]]:
        """See :meth:`Transport.each_master`: every master of the slot map, one after another."""
        router = self.router
        await router.refresh()
        return [
            (f"{host}:{port}", await router.call_on((host, port), *args))
            for host, port in router.masters
        ]

    def subscriber(self, op_timeout: float) -> ShardedSubscriber:
        """See :meth:`Transport.subscriber`: sharded, one connection per master in use."""
        return ShardedSubscriber(self.router, op_timeout)

    async def blocking_connection(self, key: str) -> AbstractConnection:
        """See :meth:`Transport.blocking_connection`: to the master owning ``key``'s slot."""
        address = await self.router.address_of(slot_of(key))
        return await opened(self.router.new_connection(address))

    def ready_index(
        self,
        prefix: str,
        command: Command,
        guard: OperationGuard,
        scripts: Mapping[str, Script],
    ) -> ReadyIndex:
        """See :meth:`Transport.ready_index`: one set per slot, and a directory."""
        return SlotReadySets(
            self.router,
            prefix,
            guard,
            unlist=scripts["inbox_unlist"],
            forget=scripts["inbox_forget_slot"],
            read=scripts["inbox_ready"],
            directory=scripts["inbox_directory"],
            op_timeout=guard.op_timeout or 5.0,
        )

    async def aclose(self, *, owned: bool) -> None:
        """See :meth:`Transport.aclose` (every master's pool)."""
        await self.router.aclose()
