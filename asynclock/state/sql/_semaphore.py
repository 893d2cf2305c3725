"""The semaphores (:class:`~asynclock.state.SemaphoreState`) of the SQL states, driver-free.

:class:`SQLSemaphoreState` adds the semaphore operations to
:class:`~asynclock.state.sql._state.SQLState`: parameters in, answers out, the same for
PostgreSQL and MySQL. Each operation is one named statement of the backend's ``queries.sql``;
acquire, release and abandon call a function (PostgreSQL) or procedure (MySQL) of its
``schema.sql`` that first locks the key's row of ``{table_prefix}semaphores``, so the
operations of one key run one after another in every process.

Wake-ups: a release (or abandon) answers the waiters it made eligible, and this state wakes its
own at once. Other processes: PostgreSQL's functions ``NOTIFY`` each of them on the state's
release channel (payload ``"<key id hex>:<owner>"``), which the listener turns into a wake-up
of that waiter only; MySQL's procedures interrupt the ear of each of their states, which then
wakes those waiters only (``mysql/_semaphore_ear.py``). The backend's hooks:
:meth:`~SQLSemaphoreState._semaphore_listen`, :meth:`~SQLSemaphoreState._new_semaphore_watch`
and :meth:`~SQLSemaphoreState._semaphore_ear`.

An implementation detail shared by two backends, not part of the contract.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, TypeVar

from asynclock._validate import check_key, check_permits, check_ttl, ttl_ms
from asynclock.state._protocol import Grant, LockInfo, SemaphoreInfo
from asynclock.state._watch import registered
from asynclock.state.sql._state import PURGE_BATCH, SQLState

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from asynclock.state.sql._driver import WakeableWatch

__all__ = ["SQLSemaphoreState"]

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")


class SQLSemaphoreState(SQLState[C, S, R]):
    """A SQL state with semaphores: holders and a queue of waiters per key, in tables.

    Invariants (each enforced by the routines, against every process): at most ``limit``
    live holders per key at the moment of every grant; tokens ``max(last + 1, server clock in
    µs)`` per key; a waiter takes a permit only in arrival order; a given-up owner (its mark
    row) is never granted nor queued.
    """

    #: the purge statements of the semaphore tables, in order (``queries.sql`` names)
    _SEMAPHORE_PURGES: tuple[str, ...] = ("purge_semaphores",)

    def _purge_jobs(self) -> tuple[tuple[str, dict[str, object]], ...]:
        params: dict[str, object] = {"retention_ms": self._retention_ms, "batch": PURGE_BATCH}
        return (*super()._purge_jobs(), *((name, params) for name in self._SEMAPHORE_PURGES))

    def _semaphore_params(self, key: str, owner: str) -> tuple[str, dict[str, object]]:
        """The id of ``key`` in hex (its watches' prefix) and the parameters every statement
        takes."""
        check_key(key)
        ident, full = self._ids(key)
        hex_id = ident.hex()
        return hex_id, {
            "id": self._id_param(ident),
            "name": full,
            "owner": owner,
            "channel": self._channel,
            "payload": hex_id,
            "ear": self._semaphore_ear(),
        }

    # -- the backend's wake-up hooks (PostgreSQL: its LISTEN connection; MySQL: an ear) ------

    def _semaphore_ear(self) -> object:
        """What a waiter's place names so that releases of other states reach it (MySQL: the
        connection id of this state's ear, ``None`` while it is down); ``None`` by default."""
        return None

    async def _semaphore_listen(self) -> None:
        """Make sure releases of other states reach this state's semaphore waiters by now."""
        await self._listen()

    def _new_semaphore_watch(self, loop: asyncio.AbstractEventLoop) -> WakeableWatch:
        """A semaphore waiter's watch (:meth:`_new_watch`'s by default)."""
        return self._new_watch(loop)

    def _wake_semaphore_waiters(self) -> None:
        """Wake every semaphore waiter of this state (their wake-ups may have been lost)."""
        for where, watches in tuple(self._watches.items()):
            if ":" in where:  # "<key id hex>:<owner>": a semaphore waiter's (a lock's: the id)
                for watch in tuple(watches):
                    watch.fire()

    def _wake_waiters(self, hex_id: str, woken: object) -> None:
        """Wake this state's own watches of the owners a release answered (a list, or text
        with one owner per line)."""
        for owner in _owners(woken):
            self._wake(f"{hex_id}:{owner}")

    async def semaphore_acquire(
        self, key: str, owner: str, limit: int, ttl: float, *, hold: float | None = None
    ) -> Grant:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_acquire` (one routine call)."""
        _, params = self._semaphore_params(key, owner)
        params["limit"] = check_permits(limit, key=key)
        params["ttl_ms"] = ttl_ms(check_ttl(ttl, key=key))
        params["hold_ms"] = ttl_ms(check_ttl(hold, "hold", key=key)) if hold is not None else 0
        # idempotent per owner: a repeat re-arms the same permit or renews the same place
        answer = await self._run("semaphore_acquire", params, idempotent=True)
        self._maybe_purge()
        token, retry_after = self._rows(answer)[0][:2]
        if token is not None:
            return Grant(int(str(token)))
        return Grant(None, max(_seconds(retry_after), 0.0))

    async def semaphore_release(self, key: str, owner: str) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_release` (one routine call)."""
        hex_id, params = self._semaphore_params(key, owner)
        answer = await self._run("semaphore_release", params, idempotent=False)
        owned, woken = self._rows(answer)[0][:2]
        self._wake_waiters(hex_id, woken)
        return bool(owned)

    async def semaphore_abandon(self, key: str, owner: str) -> None:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_abandon` (one routine call; the
        mark lives ``max(2 * op_timeout, 2)`` seconds)."""
        hex_id, params = self._semaphore_params(key, owner)
        params["mark_ms"] = self._mark_ttl_ms
        answer = await self._run("semaphore_abandon", params, idempotent=True)
        rows = self._rows(answer)
        if rows:
            self._wake_waiters(hex_id, rows[0][0])

    async def semaphore_extend(self, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_extend` (one UPDATE)."""
        _, params = self._semaphore_params(key, owner)
        params["ttl_ms"] = ttl_ms(check_ttl(ttl, key=key))
        return self._matched(await self._run("semaphore_extend", params, idempotent=True))

    async def semaphore_inspect(self, key: str) -> SemaphoreInfo:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_inspect` (one read)."""
        _, params = self._semaphore_params(key, "")
        answer = await self._run("semaphore_inspect", params, idempotent=True)
        waiting = 0
        holders: list[LockInfo] = []
        for owner, remaining, token, count in self._rows(answer):
            if owner is None:
                waiting = int(str(count or 0))
            else:
                holders.append(
                    LockInfo(key, _text(owner), max(_seconds(remaining), 0.0), int(str(token)))
                )
        holders.sort(key=lambda info: info.token)
        return SemaphoreInfo(key, tuple(holders), waiting)

    @contextlib.asynccontextmanager
    async def semaphore_watch(self, key: str, owner: str) -> AsyncIterator[WakeableWatch]:
        """See :meth:`asynclock.state.SemaphoreState.semaphore_watch`: woken by a release of
        this state at once, by another state's NOTIFY (PostgreSQL) or through this state's ear
        (MySQL)."""
        hex_id, _ = self._semaphore_params(key, owner)
        where = f"{hex_id}:{owner}"
        watch = self._new_semaphore_watch(asyncio.get_running_loop())
        await self._semaphore_listen()
        with registered(self._watches, where, watch):
            yield watch


def _owners(value: object) -> list[str]:
    """Owner ids from a routine's answer: a list (PostgreSQL ``text[]``) or text with one owner
    per line (MySQL)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [_text(item) for item in value]
    return [line for line in _text(value).split("\n") if line]


def _text(value: object) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _seconds(value: object) -> float:
    """A number of seconds as the driver answers it (float, Decimal, int or text)."""
    return float(str(value)) if value is not None else 0.0
