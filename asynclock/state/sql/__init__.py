"""What PostgresState and MySQLState share, without their drivers (internal, not the contract).

* ``_queries.py``: the named statements of each backend's ``queries.sql`` and ``schema.sql``,
  and the values they take (key ids, abandon marks, LIKE patterns).
* ``_options.py``: the options every SQL state takes, and their checks.
* ``_driver.py``: :class:`~asynclock.state.sql._driver.SQLDriver`, the hooks a backend supplies
  (how a statement runs on its driver, which errors mean what, how its answers read).
* ``_state.py``: :class:`~asynclock.state.sql._state.SQLState`, the State operations around
  those statements, their deadline, errors and retries, the purge loop, the watch registry.
* ``_inbox.py``: :class:`~asynclock.state.sql._inbox.SQLInboxState`, the durable inbox's part.

The public classes stay where SPEC.md puts them: ``asynclock.state.postgres.PostgresState`` and
``asynclock.state.mysql.MySQLState``.
"""
