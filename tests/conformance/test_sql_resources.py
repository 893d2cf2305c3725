"""The SQL files ship in the package, parse, and define every query the SQL states run."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from asynclock.state.sql._queries import load_queries, load_schema, split_statements

PACKAGES = ("asynclock.state.postgres", "asynclock.state.mysql")
QUERIES = {
    "acquire",
    "release",
    "abandon",
    "extend",
    "inspect",
    "dedupe_add",
    "dedupe_remaining",
    "dedupe_forget",
    "dedupe_keep",
    "purge_locks",
    "purge_dedupe",
    "held_locks",
    "inbox_accept",
    "inbox_step",
    "inbox_take",
    "inbox_requeue",
    "inbox_discard",
    "inbox_ready",
    "inbox_keys",
    "inbox_dead_letters",
    "inbox_claim",
    "inbox_worker_seen",
    "inbox_worker_gone",
    "semaphore_acquire",
    "semaphore_release",
    "semaphore_abandon",
    "semaphore_extend",
    "semaphore_inspect",
    "purge_semaphores",
    # supersede hand-overs between processes (#26)
    "supersede_carry",
    "supersede_collect",
    "purge_supersede_carried",
}
#: statements only one backend has (PostgreSQL's claims carry their owner: ClaimingState; MySQL
#: purges a semaphore's permits and places in statements of their own: no multi-table DELETE, and
#: its inbox workers wait in a statement of their own: the ear, killed by the hand-out)
OWN_QUERIES = {
    "asynclock.state.postgres": {"forget_claimed", "supersede", "inbox_ear"},
    "asynclock.state.mysql": {
        "purge_semaphore_holders",
        "purge_semaphore_waiters",
        "inbox_ear",
        "inbox_ear_moved",  # a reopened ear names its new id in its worker's row
        # the semaphore waiters' ear (push wake-ups through KILL QUERY) and its rows
        "semaphore_ear",
        "semaphore_heard",
        "purge_semaphore_ears",
        # supersede signals: the holder state's ear and the rows naming it (KILL QUERY too)
        "supersede",
        "supersede_listen",
        "supersede_unlisten",
        "supersede_heard",
        "supersede_read",
        "supersede_ear",
        "purge_supersede_ears",
    },
}
#: the tables schema.sql creates, and its versioned routines (functions or procedures), in order
TABLES = (
    "locks",
    "dedupe",
    "inboxes",
    "inbox_entries",
    "inbox_workers",
    "semaphores",
    "semaphore_holders",
    "semaphore_waiters",
)
#: tables of one backend only (MySQL: the ears its semaphore releases and supersede signals
#: interrupt, where PostgreSQL has NOTIFY)
OWN_TABLES = {
    "asynclock.state.postgres": (),
    "asynclock.state.mysql": ("semaphore_ears", "supersede_ears"),
}
#: tables both create, after their own (supersede hand-overs between processes, #26)
LATER_TABLES = ("supersede_carried",)
ROUTINES = {
    # the versions this release calls, in file order: those of earlier releases stay in the
    # databases where they were made (an older worker's own script makes what it calls)
    "asynclock.state.postgres": (
        "inbox_append_v1",
        "inbox_requeue_rows_v1",
        # retries that wait and parked keys (SPEC 9, #30): new versions of what changed
        "inbox_lock_rows_v2",
        # a release NOTIFYs only for a flagged key (#24: each NOTIFY costs every LISTENing
        # session of the database a transaction)
        "inbox_release_v3",
        "inbox_step_v4",
        "inbox_take_v4",
        "inbox_open_v1",
        # the hand-out wakes a worker through its ear, not a NOTIFY (#24: a NOTIFY costs every
        # LISTENing session of the database a transaction)
        "inbox_wake_one_v2",
        "inbox_accept_v6",
        "inbox_hand_out_v2",
        "inbox_requeue_v4",
        "inbox_discard_v2",
        # a claim passes over a key promised to another live worker (#24)
        "inbox_promised_v1",
        "inbox_claim_v4",
        "inbox_ear_v1",
        # a stopping worker hands its unclaimed hint on
        "inbox_worker_gone_v1",
        "semaphore_eligible_v1",
        "semaphore_wake_v1",
        "semaphore_acquire_v1",
        "semaphore_release_v1",
        "semaphore_abandon_v1",
    ),
    "asynclock.state.mysql": (
        "inbox_append_v1",
        # retries that wait and parked keys (SPEC 9, #30): the columns' guarded upgrade, then
        # new versions of what changed
        "column_upgrade_v1",
        "inbox_lock_rows_v2",
        "inbox_release_v2",
        "inbox_step_v3",
        "inbox_take_v3",
        "inbox_requeue_rows_v2",
        "inbox_requeue_v4",
        "inbox_discard_v2",
        # the hand-out's hint (#24): the woken worker's key in its row; its ear answers only that
        "inbox_wake_one_v2",
        "inbox_hand_out_v2",
        "inbox_accept_v4",
        "inbox_claim_v4",
        "inbox_worker_gone_v1",
        # the semaphore waiters' ears (push wake-ups through KILL QUERY)
        "ear_kill_v1",
        "semaphore_mark_v1",
        "semaphore_ring_v1",
        "semaphore_heard_v1",
        "semaphore_eligible_v1",
        "semaphore_fresh_v1",
        # v2: a place names its state's ear, a release rings the ears of those it made eligible
        "semaphore_acquire_v2",
        "semaphore_release_v2",
        "semaphore_abandon_v2",
        "supersede_v1",
        # a supersede hand-over collected (read and deleted: MySQL has no DELETE ... RETURNING)
        "supersede_collect_v1",
    ),
}


@pytest.mark.parametrize("package", PACKAGES)
def test_sql_files_load_from_the_package(package: str) -> None:
    folder = resources.files(package)
    for name in ("schema.sql", "queries.sql"):
        text = folder.joinpath(name).read_text(encoding="utf-8")
        assert text.startswith("--"), f"{package}/{name} must open with its contract comment"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_query_is_defined_and_described(package: str) -> None:
    queries = load_queries(package, "asynclock_")
    assert set(queries) == QUERIES | OWN_QUERIES[package]
    for query in queries.values():
        assert query.description, f"{query.name} has no description"
        assert "{prefix}" not in query.text
        assert "asynclock_" in query.text


@pytest.mark.parametrize("package", PACKAGES)
def test_schema_is_idempotent_create_statements(package: str) -> None:
    statements = load_schema(package, "app_")
    code = [
        " ".join(line for line in s.splitlines() if line and not line.startswith("--"))
        for s in statements
    ]
    tables = [c for c in code if c.startswith("CREATE TABLE IF NOT EXISTS app_")]
    names = (*TABLES, *OWN_TABLES[package], *LATER_TABLES)
    assert [t.split()[5] for t in tables] == [f"app_{name}" for name in names]
    # a guarded upgrade of an older table (PostgreSQL): changes a table only when it lacks a column
    upgrades = [c for c in code if c.startswith("DO $$")]
    for upgrade in upgrades:
        assert "IF NOT EXISTS" in upgrade, upgrade
        assert "ALTER TABLE app_" in upgrade, upgrade
    routines = [c for c in code if "$$" in c and c not in upgrades]
    assert len(routines) == len(ROUTINES[package])
    for routine, name in zip(routines, ROUTINES[package], strict=True):
        # replaced in place (PostgreSQL), or made once (MySQL): a new body needs a new version
        assert routine.startswith(
            (
                f"CREATE OR REPLACE FUNCTION app_{name}(",
                f"CREATE PROCEDURE IF NOT EXISTS app_{name}(",
            )
        ), routine[:80]
        assert routine.count("$$") == 2
    # a guarded upgrade of an older table (MySQL): a CALL of a versioned upgrade procedure
    calls = [c for c in code if c.startswith("CALL app_")]
    for call in calls:
        assert call.removeprefix("CALL app_").split("(")[0] in ROUTINES[package], call
        assert "_upgrade_v" in call, call
    others = [
        c
        for c in code
        if c not in tables and c not in routines and c not in upgrades and c not in calls
    ]
    assert all(c.startswith("CREATE INDEX IF NOT EXISTS app_") for c in others), others


def test_statements_split_at_line_end_semicolons_outside_dollar_bodies() -> None:
    text = (
        "-- a comment; not the end\n"
        "CREATE TABLE t (a int);\n"
        "CREATE FUNCTION f() AS $$\nBEGIN\n  x := 1;\n  RETURN;\nEND\n$$;\n"
        "SELECT ';'   ;\n"
    )
    assert split_statements(text, "here") == [
        "-- a comment; not the end\nCREATE TABLE t (a int)",
        "CREATE FUNCTION f() AS $$\nBEGIN\n  x := 1;\n  RETURN;\nEND\n$$",
        "SELECT ';'",
        "",
    ]
    with pytest.raises(ValueError, match=r"here: a \$\$ body is not closed"):
        split_statements("CREATE FUNCTION f() AS $$ BEGIN;\nEND;\n", "here")


def test_positional_placeholders_reuse_numbers() -> None:
    query = load_queries("asynclock.state.postgres", "asynclock_")["extend"]
    sql, names = query.dollar()
    assert names == ("ttl_ms", "id", "owner")
    assert "%(" not in sql
    assert "$3" in sql


@pytest.mark.parametrize("package", PACKAGES)
def test_the_schema_makes_only_the_routines_this_release_calls(package: str) -> None:
    # an older version's body is a copy of logic nobody here runs: the release that called it
    # makes it with its own script, so this one leaves it out
    statements = load_schema(package, "app_")
    bodies = {
        m.group(1): statement
        for statement in statements
        if (
            m := re.search(
                r"^CREATE (?:OR REPLACE FUNCTION|PROCEDURE IF NOT EXISTS) app_(\w+)\(",
                statement,
                re.MULTILINE,
            )
        )
    }
    called = [q.text for q in load_queries(package, "app_").values()]
    called += [s for s in statements if "\nCALL app_" in f"\n{s}"]  # upgrades
    code = resources.files(package)
    called += [
        item.read_text(encoding="utf-8")
        for item in code.iterdir()
        if item.name.endswith(".py")  # names a module sends itself (an ear's kill)
    ]
    reached: set[str] = set()
    todo = [n for n in bodies if any(re.search(rf"\b(?:app_)?{n}\b", text) for text in called)]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [n for n in bodies if n not in reached and f"app_{n}(" in bodies[name]]
    assert sorted(set(bodies) - reached) == []
