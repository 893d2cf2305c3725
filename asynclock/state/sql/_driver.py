"""The hooks a SQL backend supplies to :class:`~asynclock.state.sql._state.SQLState`.

What depends on the driver, and nothing else: how a named query is prepared and executed on one
of its connections, which driver errors mean "unavailable" or "the statement failed" (or "never
sent"), how its answers read (``RETURNING`` rows for PostgreSQL, ``rowcount``/``LAST_INSERT_ID``
for MySQL), and how a watch hears releases (a LISTEN connection, or bounded polling).
PostgresState and MySQLState implement them; ``SQLState`` calls them and nothing else of the
driver. Internal, not part of the contract.
"""

from __future__ import annotations

import abc
import asyncio
from typing import TYPE_CHECKING, ClassVar, Generic, Protocol, TypeVar

from asynclock.state._protocol import Watch

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from asynclock.state._protocol import Grant, LockInfo, Release
    from asynclock.state.sql._queries import Query

__all__ = ["SQLDriver", "WakeableWatch"]

C = TypeVar("C")
S = TypeVar("S")
R = TypeVar("R")


class WakeableWatch(Watch, Protocol):
    """A :class:`~asynclock.state.Watch` that the state wakes when it learns of a release."""

    def fire(self) -> None:
        """A release of the key was seen: wake the waiter."""


class SQLDriver(abc.ABC, Generic[C, S, R]):
    """The driver's part of a SQL state.

    ``C`` is the driver's connection, ``S`` a prepared statement, ``R`` the raw answer of one
    statement.
    """

    #: the server's name in ``where`` ("<BACKEND> at <url>")
    _BACKEND: ClassVar[str]
    #: the package holding ``schema.sql`` and ``queries.sql``
    _PACKAGE: ClassVar[str]
    #: driver errors that mean "cannot reach the server / the connection is gone"
    _UNAVAILABLE: ClassVar[tuple[type[BaseException], ...]]
    #: the claim parameters of a backend whose acquire and release statements can also record
    #: a dedupe claim (ClaimingState), set to "no claim"; none by default
    _NO_CLAIM: ClassVar[Mapping[str, object]] = {}

    @abc.abstractmethod
    def _prepare(self, query: Query) -> S:
        """``query`` in the form :meth:`_execute` runs."""

    @abc.abstractmethod
    def _schema(self, statements: list[str]) -> list[S]:
        """The statements that apply ``schema.sql`` (given as its list of statements)."""

    @abc.abstractmethod
    async def _execute(self, conn: C, statement: S, params: Mapping[str, object]) -> R:
        """Run ``statement`` with ``params`` on ``conn``; the driver's answer."""

    @abc.abstractmethod
    def _is_statement_error(self, exc: BaseException) -> bool:
        """A server error about the statement itself: the connection stays in sync and usable."""

    def _rolled_back_whole(self, exc: BaseException) -> bool:
        """A statement error after which the statement may simply run again (deadlock victim)."""
        return False

    def _never_sent(self, exc: BaseException) -> bool:
        """The driver refused to send the statement at all: retrying it cannot run it twice."""
        return False

    @staticmethod
    def _id_param(ident: bytes) -> object:
        """The key id as the statements take it (the SHA-256 digest itself by default)."""
        return ident

    @abc.abstractmethod
    def _grant(self, answer: R) -> Grant:
        """``acquire``'s answer."""

    @abc.abstractmethod
    def _release(self, answer: R) -> Release:
        """``release``'s answer."""

    @abc.abstractmethod
    def _freed(self, answer: R) -> bool:
        """Whether ``abandon`` freed the key (released it, or withdrew a reservation)."""

    @abc.abstractmethod
    def _matched(self, answer: R) -> bool:
        """Whether ``extend`` or ``dedupe_forget`` found what it looked for."""

    @abc.abstractmethod
    def _lock_info(self, key: str, answer: R) -> LockInfo | None:
        """``inspect``'s answer."""

    @abc.abstractmethod
    def _held(self, answer: R) -> list[tuple[str, str, float, int]]:
        """``held_locks``'s rows as ``(prefixed name, owner, remaining seconds, token)``."""

    @abc.abstractmethod
    def _claimed(self, answer: R) -> bool:
        """Whether ``dedupe_add`` recorded the key."""

    @abc.abstractmethod
    def _remaining(self, answer: R) -> float | None:
        """``dedupe_remaining``'s answer: the live record's seconds left, or ``None``."""

    @abc.abstractmethod
    def _rows(self, answer: R) -> Sequence[Sequence[object]]:
        """The rows of a statement's answer (each a sequence of column values)."""

    @abc.abstractmethod
    def _deleted(self, answer: R) -> int:
        """How many rows a purge statement deleted."""

    @abc.abstractmethod
    def _new_watch(self, loop: asyncio.AbstractEventLoop) -> WakeableWatch:
        """A watch for one key."""

    def _new_key_watch(self, loop: asyncio.AbstractEventLoop, ident: str) -> WakeableWatch:
        """A watch for the key whose id is ``ident`` (hex); :meth:`_new_watch`'s by default."""
        return self._new_watch(loop)

    async def _listen(self) -> None:
        """Make sure releases from other processes are heard (PostgreSQL: LISTEN) by now."""
        await asyncio.sleep(0)

    async def _stop_listening(self) -> None:
        """Stop what :meth:`_listen` started."""
