"""The shared SQL servers seen by a fault test: states whose sessions it alone can find and kill.

The SQL fault tests run against the loopback PostgreSQL and MariaDB of the backend matrix,
which CI shares with every other test: they never stop a server and never kill a session that
is not theirs. Each test gets a :class:`SQLTarget` that tags its states' sessions:

* PostgreSQL: every state connects with an ``application_name`` of this test alone
  (``asynclock_f_<hex>``); ``pg_terminate_backend`` picks the sessions by that name.
* MariaDB: every state logs in as a user created for this test alone (``asynclock_f_<hex>``,
  dropped afterwards); ``KILL`` picks the sessions by that user.

The admin connection that kills them is the target's own (another name, another user), and
the keys the test wrote are deleted afterwards (the matrix's namespace purge).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiomysql  # type: ignore[import-untyped]
import asyncpg  # type: ignore[import-untyped]

from asynclock.state.mysql import MySQLState
from asynclock.state.postgres import PostgresState
from tests._matrix import Backend, purge_namespace

if TYPE_CHECKING:
    from asynclock.state.sql._state import SQLState

    AnySQLState = SQLState[Any, Any, Any]

#: kills the sessions of one application name; the CTE is materialized first, so the name
#: filter runs before any pg_terminate_backend (a WHERE clause could call it on other rows)
_PG_KILL = """
WITH mine AS MATERIALIZED (
    SELECT pid FROM pg_stat_activity
    WHERE application_name = $1 AND pid <> pg_backend_pid()
)
SELECT pid FROM mine WHERE pg_terminate_backend(pid)
"""


class SQLTarget:
    """One test's view of a shared SQL server: its states, its sessions, its admin connection.

    Attributes:
        backend: the matrix row (``POSTGRES`` or ``MYSQL``).
        tag: the application name (PostgreSQL) or user name (MariaDB) of this test's sessions.
        namespace: the key namespace of this test's states (purged on close).
        killed: every session id :meth:`kill_all` has killed so far.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.namespace = uuid.uuid4().hex
        self.tag = f"asynclock_f_{self.namespace[:12]}"
        self.killed: set[int] = set()
        self._password = uuid.uuid4().hex
        self._parts = urlsplit(backend.url)
        self._admin: Any = None
        self._states: list[AnySQLState] = []

    @property
    def postgres(self) -> bool:
        return self.backend.name == "postgres"

    @property
    def port(self) -> int:
        """The server's port (what a proxy in front of it relays to)."""
        return self._parts.port or (5432 if self.postgres else 3306)

    async def start(self) -> None:
        parts = self._parts
        if self.postgres:
            self._admin = await asyncpg.connect(
                self.backend.url,
                timeout=10,
                server_settings={"application_name": f"{self.tag}-admin"},
            )
            return
        self._admin = await aiomysql.connect(
            host=parts.hostname or "127.0.0.1",
            port=self.port,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            db=self._database,
            autocommit=True,
            connect_timeout=10,
        )
        # the user is this test's alone: KILL by user never reaches another session
        await self._mysql(f"CREATE USER '{self.tag}'@'%' IDENTIFIED BY '{self._password}'")
        await self._mysql(f"GRANT ALL ON `{self._database}`.* TO '{self.tag}'@'%'")

    async def aclose(self) -> None:
        for state in self._states:
            await state.aclose()
        await purge_namespace(self.backend, self.namespace)
        if self._admin is None:
            return
        if self.postgres:
            await self._admin.close()
            return
        try:
            # the sessions still open (a state that failed to close) go with their user
            await self.kill_all()
            await self._mysql(f"DROP USER IF EXISTS '{self.tag}'@'%'")
        finally:
            self._admin.close()

    @property
    def _database(self) -> str:
        return unquote(self._parts.path.lstrip("/")) or "test"

    def url(self, port: int | None = None) -> str:
        """The URL of this test's states (through a proxy on ``port`` when given)."""
        parts = self._parts
        host = parts.hostname or "127.0.0.1"
        netloc = f"{host}:{port or self.port}"
        if self.postgres:
            auth = parts.netloc.rpartition("@")[0]
            return urlunsplit(parts._replace(netloc=f"{auth}@{netloc}" if auth else netloc))
        return urlunsplit(parts._replace(netloc=f"{self.tag}:{self._password}@{netloc}"))

    def open(self, port: int | None = None, **options: Any) -> AnySQLState:
        """A new state of this test's namespace and sessions (closed by :meth:`aclose`)."""
        options.update(self.backend.options(self.namespace))
        state: AnySQLState
        if self.postgres:
            state = PostgresState.from_url(self.url(port), application_name=self.tag, **options)
        else:
            state = MySQLState.from_url(self.url(port), **options)
        self._states.append(state)
        return state

    async def sessions(self) -> set[int]:
        """The ids of this test's live sessions on the server (killed ones excluded)."""
        if self.postgres:
            rows = await self._admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1", self.tag
            )
            return {int(row[0]) for row in rows} - self.killed
        rows = await self._mysql(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (self.tag,)
        )
        return {int(row[0]) for row in rows} - self.killed

    async def listeners(self) -> set[int]:
        """PostgreSQL: the sessions of this test whose last statement was a LISTEN."""
        assert self.postgres
        rows = await self._admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'",
            self.tag,
        )
        return {int(row[0]) for row in rows} - self.killed

    async def kill_all(self) -> set[int]:
        """Kill every session of this test at once (terminate / KILL); their ids."""
        if self.postgres:
            rows = await self._admin.fetch(_PG_KILL, self.tag)
            killed = {int(row[0]) for row in rows}
        else:
            killed = set()
            for ident in await self.sessions():
                try:
                    await self._mysql(f"KILL CONNECTION {int(ident)}")
                except aiomysql.OperationalError as exc:  # noqa: PERF203 - one per session
                    if exc.args[0] != 1094:  # ER_NO_SUCH_THREAD: it ended by itself meanwhile
                        raise
                else:
                    killed.add(ident)
        self.killed |= killed
        return killed

    async def running(self, text: str) -> set[int]:
        """MariaDB: this test's sessions running a statement that contains ``text``."""
        rows = await self._mysql(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s AND INFO LIKE %s",
            (self.tag, f"%{text}%"),
        )
        return {int(row[0]) for row in rows} - self.killed

    async def kill(self, session: int) -> None:
        """MariaDB: kill one session of this test."""
        await self._mysql(f"KILL CONNECTION {int(session)}")
        self.killed.add(session)

    async def lock_holder(self, name: str) -> int | None:
        """MariaDB: the session holding the named lock ``name`` (``GET_LOCK``), if any."""
        rows = await self._mysql("SELECT IS_USED_LOCK(%s)", (name,))
        return None if rows[0][0] is None else int(rows[0][0])

    async def flagged(self, state: AnySQLState, key: str) -> bool:
        """Whether a waiting acquire of ``key`` has flagged its row (a waiter is registered)."""
        table = f"{state.table_prefix}locks"
        name = state.prefix + key
        if self.postgres:
            flag = await self._admin.fetchval(f"SELECT flag FROM {table} WHERE name = $1", name)
            return flag is not None
        rows = await self._mysql(f"SELECT flag FROM {table} WHERE name = %s", (name,))
        return bool(rows) and rows[0][0] is not None

    async def _mysql(self, sql: str, args: tuple[object, ...] | None = None) -> Any:
        async with self._admin.cursor() as cursor:
            await cursor.execute(sql, args)
            return await cursor.fetchall()
