-- MySQL 8 / MariaDB 10.6+ schema of MySQLState. {prefix} is the table_prefix option.
-- Every statement is idempotent; MySQLState runs them on first use (create_schema=True).
-- With create_schema=False, run this file in a migration.
-- Times are UTC_TIMESTAMP(3) values (never NOW(), which follows the session time zone), so
-- clients with different time zones agree on expiry. Owner ids, flags and marks are binary
-- strings, so they compare byte for byte whatever the table's collation.

-- One row per lock key ever taken. The row stays after release so the next fencing token
-- continues from it; purge_expired() deletes rows free for longer than token_retention.
--   held:     owner set, expires_at in the future (the lock's expiry)
--   reserved: owner NULL, flag set, expires_at = end of the reservation for flag's state
--   free:     anything else (owner NULL and no flag, or expires_at passed)
CREATE TABLE IF NOT EXISTS {prefix}locks (
    id              BINARY(32) NOT NULL PRIMARY KEY,  -- SHA-256 of the prefixed key
    name            LONGTEXT CHARACTER SET utf8mb4 NOT NULL,  -- the prefixed key itself
    owner           VARBINARY(512) NULL,             -- the holder's owner id
    flag            VARBINARY(512) NULL,             -- a waiting state (process) asked for a turn
    token           BIGINT NOT NULL,                 -- the last fencing token issued
    expires_at      DATETIME(3) NOT NULL,
    abandoned       BLOB NOT NULL,                   -- "\n<owner>\n..." acquires given up
    abandoned_until DATETIME(3) NOT NULL             -- the marks expire then
) ENGINE = InnoDB;

-- One row per dedupe record; a record whose expires_at passed counts as absent.
CREATE TABLE IF NOT EXISTS {prefix}dedupe (
    id          BINARY(32) NOT NULL PRIMARY KEY,     -- SHA-256 of the prefixed key
    name        LONGTEXT CHARACTER SET utf8mb4 NOT NULL,
    expires_at  DATETIME(3) NOT NULL,
    claims      BIGINT NOT NULL                      -- claims so far; carries the "claimed" answer
) ENGINE = InnoDB;
