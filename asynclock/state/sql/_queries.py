"""The named statements of the SQL states (``postgres/`` and ``mysql/``) and the values they take.

The query and schema loaders, the table prefix check, and the values every statement is given:
key ids (SHA-256 of the prefixed key) and abandon marks. The states themselves share
:class:`asynclock.state.sql._state.SQLState`.

Queries live in ``queries.sql`` beside each backend, in procrastinate's named format::

    -- acquire --
    -- What it does, and why it is atomic.
    INSERT INTO {prefix}locks ... %(owner)s ...

A block starts at a ``-- name --`` line; the comment lines right after it are its description
and the rest, up to the next block, is one statement. Placeholders are named (``%(owner)s``) in
the file; :class:`Query` maps them to ``$1, $2, ...`` for drivers that want positional ones
(asyncpg), and ``{prefix}`` is replaced by the configured table prefix (validated as a plain
identifier, because table names cannot be parameters). ``schema.sql`` is a list of idempotent
statements separated by ``;`` at the end of a line; a body between ``$$`` marks (a PostgreSQL
function, a MySQL procedure) is kept whole, whatever ``;`` it holds (see :func:`load_schema`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

__all__ = [
    "Query",
    "check_table_prefix",
    "glob_to_like",
    "key_id",
    "like_escape",
    "load_queries",
    "load_schema",
    "mark_of",
    "split_statements",
]

_BLOCK = re.compile(r"^-- ([a-z_][a-z0-9_]*) --[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,39}")


@dataclass(frozen=True, slots=True)
class Query:
    """One named statement: its text with ``%(name)s`` placeholders and its description."""

    name: str
    text: str
    description: str

    def dollar(self) -> tuple[str, tuple[str, ...]]:
        """The statement with ``$1, $2, ...`` placeholders, and the parameter name of each.

        A name used twice maps to the same ``$n``; ``%%`` becomes ``%``.
        """
        order: list[str] = []

        def number(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return "%"
            if name not in order:
                order.append(name)
            return f"${order.index(name) + 1}"

        return _PLACEHOLDER.sub(number, self.text), tuple(order)

    def names(self) -> set[str]:
        """Every parameter name the statement uses."""
        return {m.group(1) for m in _PLACEHOLDER.finditer(self.text) if m.group(1)}


def _read(package: str, filename: str) -> str:
    return resources.files(package).joinpath(filename).read_text(encoding="utf-8")


def load_queries(
    package: str, table_prefix: str, filename: str = "queries.sql"
) -> dict[str, Query]:
    """Parse ``package``'s ``queries.sql`` into ``{name: Query}`` with the table prefix applied."""
    text = _read(package, filename)
    blocks = _BLOCK.split(text)
    queries: dict[str, Query] = {}
    # split() gives [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(blocks[1::2], blocks[2::2], strict=True):
        lines = body.strip("\n").splitlines()
        described = 0
        while described < len(lines) and lines[described].startswith("--"):
            described += 1
        description = " ".join(line.removeprefix("--").strip() for line in lines[:described])
        statement = "\n".join(lines[described:]).strip().rstrip(";").strip()
        if not statement:
            raise ValueError(f"{package}/{filename}: query {name!r} has no statement")
        if name in queries:
            raise ValueError(f"{package}/{filename}: query {name!r} is defined twice")
        queries[name] = Query(name, statement.replace("{prefix}", table_prefix), description)
    return queries


def load_schema(package: str, table_prefix: str, filename: str = "schema.sql") -> list[str]:
    """The statements of ``package``'s ``schema.sql``, table prefix applied, comments kept.

    Statements end with ``;`` at the end of a line, except inside a body quoted by ``$$``
    marks, which is kept whole with its marks (PostgreSQL's dollar quoting; the MySQL state
    removes the marks, since a procedure sent alone needs no ``DELIMITER``). ``$$`` may
    therefore appear nowhere else in the file, comments included.

    Raises:
        ValueError: a ``$$`` body is not closed.
    """
    text = _read(package, filename).replace("{prefix}", table_prefix)
    return [s for s in split_statements(text, f"{package}/{filename}") if _has_code(s)]


def split_statements(text: str, where: str) -> list[str]:
    """``text`` cut at each ``;`` that ends a line outside ``$$`` bodies (see :func:`load_schema`)."""
    parts = text.split("$$")
    if len(parts) % 2 == 0:
        raise ValueError(f"{where}: a $$ body is not closed")
    statements: list[str] = []
    current = ""
    for n, part in enumerate(parts):
        if n % 2:  # inside a $$ body: never cut
            current += f"$${part}$$"
            continue
        first, *rest = re.split(r";[ \t]*$", part, flags=re.MULTILINE)
        current += first
        for piece in rest:
            statements.append(current.strip())
            current = piece
    statements.append(current.strip())
    return statements


def _has_code(statement: str) -> bool:
    return any(not line.startswith("--") for line in _code_lines(statement))


def _code_lines(statement: str) -> list[str]:
    return [line.strip() for line in statement.splitlines() if line.strip()]


def check_table_prefix(table_prefix: object) -> str:
    """A table prefix must be a plain identifier: it is pasted into the SQL, never quoted."""
    if not isinstance(table_prefix, str):
        raise TypeError(f"table_prefix must be a str, got {type(table_prefix).__name__}")
    if not _IDENTIFIER.fullmatch(table_prefix):
        raise ValueError(
            "table_prefix must be a letter or '_' followed by up to 39 letters, digits or '_', "
            f"got {table_prefix!r}"
        )
    return table_prefix


def key_id(full_key: str) -> bytes:
    """The primary key of a prefixed key: its SHA-256, so keys of any length and characters fit.

    Lone surrogates (possible in a Python ``str``) are kept rather than rejected.
    """
    return hashlib.sha256(full_key.encode("utf-8", "surrogatepass")).digest()


def mark_of(owner: str) -> str:
    """An owner as it appears in a lock row's list of abandoned owners (``"\\n<owner>\\n"``).

    Owner ids never contain a newline, so a mark matches whole entries only.
    """
    return f"\n{owner}\n"


def like_escape(text: str) -> str:
    """``text`` as a LIKE pattern that matches only itself (escape character ``!``)."""
    return text.replace("!", "!!").replace("%", "!%").replace("_", "!_")


def glob_to_like(match: str) -> str:
    """A ``*``/``?`` glob as a LIKE pattern (escape character ``!``)."""
    if not isinstance(match, str):
        raise TypeError(f"match must be a str, got {type(match).__name__}")
    if "[" in match:
        raise ValueError(f"SQL states match keys with * and ? only, got {match!r}")
    return like_escape(match).replace("*", "%").replace("?", "_")
