"""The ``from_url`` options for a PostgreSQL reached through a transaction-mode pooler.

Behind PgBouncer with ``pool_mode = transaction`` two things of a plain connection break:

* a ``LISTEN`` stays on whichever server connection ran it, which goes back to the pooler's pool
  at the end of the statement: the state's listener must connect elsewhere (``listen_url``:
  the server itself, or a session-mode pool);
* asyncpg's named prepared statements live on one server connection, and the next transaction
  may run on another ("prepared statement "__asyncpg_stmt_3__" does not exist"): its statement
  cache must be off (``statement_cache_size=0``; every statement is then prepared unnamed,
  which PgBouncer keeps on one server connection) unless the pooler tracks prepared
  statements itself (PgBouncer >= 1.21 with ``max_prepared_statements``).

Both can be given as ``from_url`` keywords or as query parameters of the URL, so a single
configuration string (an environment variable, ``--state``) can carry them::

    postgresql://app@bouncer:6432/db?statement_cache_size=0&listen_url=postgresql%3A%2F%2Fapp%40db%3A5432%2Fdb

The query parameters are removed before the URL reaches asyncpg (which would send unknown ones
to the server as settings); a keyword wins over the query parameter of the same name.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from asynclock.state._url import redact

__all__ = ["PoolerOptions", "pooler_options"]

_LISTEN_URL = "listen_url"
_STATEMENT_CACHE_SIZE = "statement_cache_size"


@dataclass(frozen=True, slots=True)
class PoolerOptions:
    """Where the statements and the listener connect, and asyncpg's statement cache.

    Invariant: ``dsn`` carries none of this module's query parameters.
    """

    #: the URL for the statement connections, as asyncpg is given it
    dsn: str
    #: the URL of the LISTEN connection (``dsn`` unless another one was given)
    listen_dsn: str
    #: asyncpg's ``statement_cache_size`` for the statement connections (``None``: its default)
    statement_cache_size: int | None


def pooler_options(
    url: str, listen_url: str | None, statement_cache_size: int | None
) -> PoolerOptions:
    """Split this module's options off ``url`` and merge them with the keywords.

    Raises:
        ValueError: ``listen_url`` is not a PostgreSQL URL, or ``statement_cache_size`` is not
            a whole number >= 0 (the message names the value, never a password).
        TypeError: a keyword has the wrong type.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    ours = {name: value for name, value in query if name in (_LISTEN_URL, _STATEMENT_CACHE_SIZE)}
    rest = [(name, value) for name, value in query if name not in ours]
    dsn = urlunsplit(parts._replace(query=urlencode(rest))) if ours else url
    if listen_url is None:
        listen_url = ours.get(_LISTEN_URL)
    elif not isinstance(listen_url, str):
        raise TypeError(f"listen_url must be a str, got {type(listen_url).__name__}")
    if listen_url is not None and listen_url.partition("://")[0].lower() not in (
        "postgresql",
        "postgres",
    ):
        raise ValueError(f"listen_url must be a postgresql:// URL, got {redact(listen_url)!r}")
    if statement_cache_size is None and _STATEMENT_CACHE_SIZE in ours:
        text = ours[_STATEMENT_CACHE_SIZE]
        if not text.isdigit():
            raise ValueError(
                f"statement_cache_size in the URL must be a whole number >= 0, got {text!r}"
            )
        statement_cache_size = int(text)
    elif statement_cache_size is not None and (
        isinstance(statement_cache_size, bool) or not isinstance(statement_cache_size, int)
    ):
        raise TypeError(
            f"statement_cache_size must be an int, got {type(statement_cache_size).__name__}"
        )
    if statement_cache_size is not None and statement_cache_size < 0:
        raise ValueError(f"statement_cache_size must be >= 0, got {statement_cache_size!r}")
    return PoolerOptions(dsn, listen_url or dsn, statement_cache_size)
