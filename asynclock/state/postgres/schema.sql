-- PostgreSQL schema of PostgresState. {prefix} is the table_prefix option ("asynclock_").
-- Every statement is idempotent; PostgresState runs them on first use (create_schema=True),
-- inside one transaction that holds a transaction-level advisory lock, so processes starting
-- together do not race on the catalog. With create_schema=False, run this file in a migration.

-- One row per lock key ever taken (fillfactor 70 leaves room for HOT updates: rows change on
-- every acquire and release). The row stays after release so the next fencing token
-- continues from it; purge_expired() deletes rows free for longer than token_retention.
--   held:     owner set, expires_at in the future (the lock's expiry)
--   reserved: owner NULL, flag set, expires_at = end of the reservation for flag's state
--   free:     anything else (owner NULL and no flag, or expires_at passed)
CREATE TABLE IF NOT EXISTS {prefix}locks (
    id              bytea PRIMARY KEY,               -- SHA-256 of the prefixed key
    name            text NOT NULL,                   -- the prefixed key itself
    owner           text,                            -- the holder's owner id
    flag            text,                            -- a waiting state (process) asked for a turn
    token           bigint NOT NULL,                 -- the last fencing token issued
    expires_at      timestamptz NOT NULL,
    abandoned       text NOT NULL DEFAULT '',        -- "\n<owner>\n..." acquires given up
    abandoned_until timestamptz NOT NULL DEFAULT '-infinity'  -- the marks expire then
) WITH (fillfactor = 70);

-- One row per dedupe record; a record whose expires_at passed counts as absent.
CREATE TABLE IF NOT EXISTS {prefix}dedupe (
    id          bytea PRIMARY KEY,                   -- SHA-256 of the prefixed key
    name        text NOT NULL,
    expires_at  timestamptz NOT NULL
);
