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

-- The durable inbox (EventDispatcher.accept / serve). One row per key with work or dead
-- letters: its counters, and the row every inbox change of the key locks first, so accepts and
-- drain steps of one key run one after the other (max_pending and release-if-empty rely on it).
-- A key's row is deleted when its last entry is gone (its next ids then start at 1 again).
CREATE TABLE IF NOT EXISTS {prefix}inboxes (
    id          BINARY(32) NOT NULL PRIMARY KEY,     -- SHA-256 of the prefixed key (as locks.id)
    name        LONGTEXT CHARACTER SET utf8mb4 NOT NULL,  -- the prefixed key itself
    space       BINARY(32) NOT NULL,                 -- SHA-256 of the state's key prefix
    last_id     BIGINT NOT NULL,                     -- the last entry id given out
    pending     INT NOT NULL,                        -- entries not done and not dead
    dead        INT NOT NULL,                        -- dead letters
    ready_at    DATETIME(3) NULL,                    -- since when it has pending entries
    KEY by_space (space, ready_at)                   -- inbox_ready (oldest first), inbox_keys
) ENGINE = InnoDB;

-- The entries: pending (error NULL) in id order, which is accept order; dead letters keep
-- their id and carry their last error.
CREATE TABLE IF NOT EXISTS {prefix}inbox_entries (
    inbox       BINARY(32) NOT NULL,                 -- inboxes.id
    id          BIGINT NOT NULL,
    attempts    INT NOT NULL,                        -- deliveries so far
    accepted_at DATETIME(3) NOT NULL,
    payload     LONGTEXT CHARACTER SET utf8mb4 NOT NULL,
    error       LONGTEXT CHARACTER SET utf8mb4 NULL, -- set: a dead letter
    PRIMARY KEY (inbox, id)
) ENGINE = InnoDB;

-- The procedures below are written between dollar-quote marks (two dollar signs), which the
-- loader keeps whole and MySQLState removes (sent alone, a procedure needs no DELIMITER); the
-- marks appear nowhere else in this file. Each runs one explicit
-- transaction (the session is in autocommit mode), rolled back on any error; the server rolls
-- it back too if the connection is lost. Under READ COMMITTED every statement reads the latest
-- committed rows, and the first one locks the key's row, so each sees every accept and step of
-- the key that committed before it. Text parameters are utf8mb4 whatever the database's default
-- character set. SQL SECURITY INVOKER: a call runs with the caller's privileges, so dropping the
-- user that created the schema (a migration user) breaks nothing. Names are versioned: CREATE
-- ... IF NOT EXISTS never replaces a body, so a changed body gets the next version (_v2, ...).

-- inbox_lock_rows: the start of inbox_step and inbox_take, inside their transaction. Locks the
-- key's lock row if p_owner holds the lock, then (only then) its inboxes row: always in that
-- order, so two steps never deadlock, and no accept can commit between a step's "empty"
-- decision and its release (an accept after it finds the key free). Aggregates make each
-- locking read answer one row, found or not (a SELECT INTO of no row would raise a warning).
-- Sets o_held (0: nothing was locked, the rest 0 too), o_rows (whether the inboxes row exists)
-- and the inbox's counters.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_lock_rows_v1(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), OUT o_held INT, OUT o_rows INT,
    OUT o_pending INT, OUT o_dead INT
)
SQL SECURITY INVOKER
$$
BEGIN
    SELECT COUNT(*) INTO o_held FROM {prefix}locks
    WHERE id = p_id AND owner = p_owner AND expires_at > UTC_TIMESTAMP(3)
    FOR UPDATE;
    SET o_rows = 0, o_pending = 0, o_dead = 0;
    IF o_held > 0 THEN
        SELECT COUNT(*), COALESCE(MAX(pending), 0), COALESCE(MAX(dead), 0)
        INTO o_rows, o_pending, o_dead
        FROM {prefix}inboxes WHERE id = p_id
        FOR UPDATE;
    END IF;
END
$$;

-- inbox_release: the end of inbox_step and inbox_take when nothing is pending, inside their
-- transaction, under the rows inbox_lock_rows locked. The inboxes row (if p_rows) goes if no
-- dead letters are left, else it is marked idle; the lock is released as the release statement
-- does: reserved for p_reservation_ms when a waiter flagged it, else free.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_release_v1(
    IN p_id BINARY(32), IN p_rows INT, IN p_dead INT, IN p_reservation_ms BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    IF p_rows > 0 AND p_dead = 0 THEN
        DELETE FROM {prefix}inboxes WHERE id = p_id;
    ELSEIF p_rows > 0 THEN
        UPDATE {prefix}inboxes SET ready_at = NULL WHERE id = p_id;
    END IF;
    UPDATE {prefix}locks
    SET owner = NULL,
        expires_at = IF(flag IS NULL, UTC_TIMESTAMP(3),
                        UTC_TIMESTAMP(3) + INTERVAL p_reservation_ms * 1000 MICROSECOND)
    WHERE id = p_id;
END
$$;

-- inbox_append: dedupe check, max_pending check, append, atomically, in a transaction of its own
-- (committed when it returns). The claim is recorded by the upsert of dedupe_add, which only
-- takes over an expired record, so two accepts of one event id never both succeed, even across
-- keys. Sets o_status and o_pending. The start of every inbox_accept_v*.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_append_v1(
    IN p_id BINARY(32), IN p_name LONGTEXT CHARACTER SET utf8mb4, IN p_space BINARY(32),
    IN p_payload LONGTEXT CHARACTER SET utf8mb4, IN p_claim BINARY(32),
    IN p_claim_name LONGTEXT CHARACTER SET utf8mb4, IN p_claim_ttl_ms BIGINT,
    IN p_max_pending INT, OUT o_status VARCHAR(16), OUT o_pending INT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_pending INT;
    DECLARE v_id BIGINT;
    DECLARE v_status VARCHAR(16) DEFAULT 'accepted';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    -- locks the key's row exclusively, inserted or not (no shared lock to upgrade: no deadlock)
    INSERT INTO {prefix}inboxes (id, name, space, last_id, pending, dead)
    VALUES (p_id, p_name, p_space, 0, 0, 0)
    ON DUPLICATE KEY UPDATE name = VALUES(name);
    SELECT pending INTO v_pending FROM {prefix}inboxes WHERE id = p_id;
    IF p_claim IS NOT NULL AND EXISTS (
        SELECT 1 FROM {prefix}dedupe WHERE id = p_claim AND expires_at > UTC_TIMESTAMP(3)
    ) THEN
        SET v_status = 'duplicate';
    ELSEIF v_pending >= p_max_pending THEN
        SET v_status = 'full';
    ELSEIF p_claim IS NOT NULL THEN
        INSERT INTO {prefix}dedupe (id, name, expires_at, claims)
        VALUES (p_claim, p_claim_name,
                UTC_TIMESTAMP(3) + INTERVAL p_claim_ttl_ms * 1000 MICROSECOND, LAST_INSERT_ID(1))
        ON DUPLICATE KEY UPDATE
            claims = IF(expires_at <= UTC_TIMESTAMP(3), LAST_INSERT_ID(claims + 1),
                        claims + 0 * LAST_INSERT_ID(0)),
            expires_at = IF(LAST_INSERT_ID() > 0,
                            UTC_TIMESTAMP(3) + INTERVAL p_claim_ttl_ms * 1000 MICROSECOND,
                            expires_at);
        IF LAST_INSERT_ID() = 0 THEN  -- recorded meanwhile by a dispatch, or another key's accept
            SET v_status = 'duplicate';
        END IF;
    END IF;
    IF v_status = 'accepted' THEN
        UPDATE {prefix}inboxes
        SET last_id = last_id + 1, pending = pending + 1,
            ready_at = COALESCE(ready_at, UTC_TIMESTAMP(3))
        WHERE id = p_id;
        SELECT last_id, pending INTO v_id, v_pending FROM {prefix}inboxes WHERE id = p_id;
        INSERT INTO {prefix}inbox_entries (inbox, id, attempts, accepted_at, payload)
        VALUES (p_id, v_id, 0, UTC_TIMESTAMP(3), p_payload);
    END IF;
    COMMIT;
    SET o_status = v_status, o_pending = v_pending;
END
$$;

-- inbox_accept_v1: inbox_append_v1, answered as one row (status, pending). No wake-up: kept for
-- releases before the hand-out (inbox_accept_v2), whose workers poll.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_accept_v1(
    IN p_id BINARY(32), IN p_name LONGTEXT CHARACTER SET utf8mb4, IN p_space BINARY(32),
    IN p_payload LONGTEXT CHARACTER SET utf8mb4, IN p_claim BINARY(32),
    IN p_claim_name LONGTEXT CHARACTER SET utf8mb4, IN p_claim_ttl_ms BIGINT,
    IN p_max_pending INT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_status VARCHAR(16);
    DECLARE v_pending INT;
    CALL {prefix}inbox_append_v1(p_id, p_name, p_space, p_payload, p_claim, p_claim_name,
                                 p_claim_ttl_ms, p_max_pending, v_status, v_pending);
    SELECT v_status, v_pending;
END
$$;

-- inbox_step: as the lock's owner, finish the head (done: delete it; with dead: make it a dead
-- letter) and hand out the next entry (attempts + 1 unless only looked at), or, when none is
-- pending, release the lock (inbox_release_v1) in the same transaction. Starts with
-- inbox_lock_rows_v1 (the lock row, then the inboxes row). Answers one row (status, entry,
-- attempts, payload, age in seconds, pending); status 'not_owner' changed nothing, 'released'
-- released the lock. v2: v1's body, with its start and its end in those two shared procedures.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_step_v2(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), IN p_done BIGINT,
    IN p_dead LONGTEXT CHARACTER SET utf8mb4, IN p_take BOOLEAN, IN p_reservation_ms BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_held INT;
    DECLARE v_rows INT;
    DECLARE v_pending INT;
    DECLARE v_dead INT;
    DECLARE v_entry BIGINT;
    DECLARE v_attempts INT;
    DECLARE v_payload LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_age_us BIGINT;
    DECLARE v_status VARCHAR(16) DEFAULT 'released';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    CALL {prefix}inbox_lock_rows_v1(p_id, p_owner, v_held, v_rows, v_pending, v_dead);
    IF v_held = 0 THEN
        SET v_status = 'not_owner';
    ELSE
        IF v_rows > 0 AND p_done IS NOT NULL THEN
            -- the head, unless dead letters were requeued in front of it meanwhile
            IF p_dead IS NULL THEN
                DELETE FROM {prefix}inbox_entries
                WHERE inbox = p_id AND id = p_done AND error IS NULL;
            ELSE
                UPDATE {prefix}inbox_entries SET error = p_dead
                WHERE inbox = p_id AND id = p_done AND error IS NULL;
            END IF;
            IF ROW_COUNT() > 0 THEN
                SET v_pending = v_pending - 1;
                SET v_dead = v_dead + IF(p_dead IS NULL, 0, 1);
                UPDATE {prefix}inboxes SET pending = v_pending, dead = v_dead WHERE id = p_id;
            END IF;
        END IF;
        IF v_pending > 0 THEN
            SELECT id, attempts, payload,
                   TIMESTAMPDIFF(MICROSECOND, accepted_at, UTC_TIMESTAMP(3))
            INTO v_entry, v_attempts, v_payload, v_age_us
            FROM {prefix}inbox_entries
            WHERE inbox = p_id AND error IS NULL
            ORDER BY id LIMIT 1;
            IF p_take THEN
                UPDATE {prefix}inbox_entries SET attempts = attempts + 1
                WHERE inbox = p_id AND id = v_entry;
                SET v_attempts = v_attempts + 1;
            END IF;
            SET v_status = 'entry';
        ELSE
            CALL {prefix}inbox_release_v1(p_id, v_rows, v_dead, p_reservation_ms);
        END IF;
    END IF;
    COMMIT;
    SELECT v_status, v_entry, v_attempts, v_payload, GREATEST(v_age_us, 0) / 1000000, v_pending;
END
$$;

-- inbox_requeue_rows: put the key's dead letters back at the head of its inbox, in id (accept)
-- order, with fresh attempt counts, in a transaction of its own. Locks the key's inboxes row
-- first, as accept and step do, so the counters stay exact. Sets o_moved: how many were put back.
-- The start of every inbox_requeue_v*.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_requeue_rows_v1(IN p_id BINARY(32), OUT o_moved INT)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_rows INT;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    SET o_moved = 0;
    START TRANSACTION;
    SELECT COUNT(*) INTO v_rows FROM {prefix}inboxes WHERE id = p_id FOR UPDATE;
    IF v_rows > 0 THEN
        UPDATE {prefix}inbox_entries
        SET error = NULL, attempts = 0, accepted_at = UTC_TIMESTAMP(3)
        WHERE inbox = p_id AND error IS NOT NULL;
        SET o_moved = ROW_COUNT();
        IF o_moved > 0 THEN
            UPDATE {prefix}inboxes
            SET pending = pending + o_moved, dead = 0,
                ready_at = COALESCE(ready_at, UTC_TIMESTAMP(3))
            WHERE id = p_id;
        END IF;
    END IF;
    COMMIT;
END
$$;

-- inbox_requeue_v1: inbox_requeue_rows_v1, answered as one row (how many). Kept for releases
-- before the hand-out (inbox_requeue_v2).
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_requeue_v1(IN p_id BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_moved INT;
    CALL {prefix}inbox_requeue_rows_v1(p_id, v_moved);
    SELECT v_moved;
END
$$;

-- inbox_take: the batch form of inbox_step. As the lock's owner, finish the pending entries whose
-- ids p_done lists (comma-separated; deleted, or dead letters with the error p_dead, wherever
-- they are in the inbox), then hand out the oldest p_limit pending entries (attempts + 1), or,
-- when none is pending, release the lock as inbox_step does, in the same transaction. Locks the
-- lock row, then the inboxes row, as inbox_step does (no deadlock, no accept stranded). v2: as
-- v1, through inbox_lock_rows_v1 and inbox_release_v1. Answers one result set, read before the
-- commit (so an accept landing after it cannot show up uncounted): a first row (status, -, -,
-- -, seconds since the newest pending entry was accepted, pending) with status 'not_owner'
-- (nothing changed), 'released' or 'pending', then one row ('entry', id, attempts, payload, age
-- in seconds, pending) per entry handed out, in id order.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_take_v2(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), IN p_done LONGTEXT,
    IN p_dead LONGTEXT CHARACTER SET utf8mb4, IN p_limit INT, IN p_reservation_ms BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_held INT;
    DECLARE v_rows INT;
    DECLARE v_pending INT DEFAULT 0;
    DECLARE v_dead INT;
    DECLARE v_gone INT;
    DECLARE v_status VARCHAR(16) DEFAULT 'released';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    CALL {prefix}inbox_lock_rows_v1(p_id, p_owner, v_held, v_rows, v_pending, v_dead);
    IF v_held = 0 THEN
        SET v_status = 'not_owner';
    ELSE
        IF v_rows > 0 AND p_done <> '' THEN
            IF p_dead IS NULL THEN
                DELETE FROM {prefix}inbox_entries
                WHERE inbox = p_id AND error IS NULL AND FIND_IN_SET(id, p_done) > 0;
            ELSE
                UPDATE {prefix}inbox_entries SET error = p_dead
                WHERE inbox = p_id AND error IS NULL AND FIND_IN_SET(id, p_done) > 0;
            END IF;
            SET v_gone = ROW_COUNT();
            IF v_gone > 0 THEN
                SET v_pending = v_pending - v_gone;
                SET v_dead = v_dead + IF(p_dead IS NULL, 0, v_gone);
                UPDATE {prefix}inboxes SET pending = v_pending, dead = v_dead WHERE id = p_id;
            END IF;
        END IF;
        IF v_pending > 0 THEN
            UPDATE {prefix}inbox_entries SET attempts = attempts + 1
            WHERE inbox = p_id AND error IS NULL
            ORDER BY id LIMIT p_limit;
            SET v_status = 'pending';
        ELSE
            CALL {prefix}inbox_release_v1(p_id, v_rows, v_dead, p_reservation_ms);
        END IF;
    END IF;
    SELECT v_status, NULL, NULL, NULL,
           (SELECT GREATEST(TIMESTAMPDIFF(MICROSECOND, accepted_at, UTC_TIMESTAMP(3)), 0)
                   / 1000000
            FROM {prefix}inbox_entries WHERE inbox = p_id AND error IS NULL
            ORDER BY id DESC LIMIT 1),
           v_pending
    UNION ALL
    (SELECT 'entry', id, attempts, payload,
            GREATEST(TIMESTAMPDIFF(MICROSECOND, accepted_at, UTC_TIMESTAMP(3)), 0) / 1000000,
            v_pending
     FROM {prefix}inbox_entries
     WHERE v_status = 'pending' AND inbox = p_id AND error IS NULL
     ORDER BY id LIMIT p_limit);
    COMMIT;
END
$$;

-- The inbox's hand-out (EventDispatcher.serve): a key with work and no holder goes to ONE worker.
-- Each serving worker has a row here, kept alive by its lease, naming the connection of its "ear":
-- a session that waits in SLEEP() for work. An accept that finds its key free wakes one live
-- worker, chosen at random, by killing its ear's query (KILL QUERY: a user may kill the queries of
-- its own sessions); the worker then takes a key (inbox_claim_v1).
CREATE TABLE IF NOT EXISTS {prefix}inbox_workers (
    id          VARBINARY(128) NOT NULL PRIMARY KEY, -- the worker's id ("<host>:<pid>:<random>")
    space       BINARY(32) NOT NULL,                 -- SHA-256 of the state's key prefix
    conn        BIGINT NOT NULL,                     -- CONNECTION_ID() of its ear
    expires_at  DATETIME(3) NOT NULL,                -- end of its lease
    KEY by_space (space, expires_at)
) ENGINE = InnoDB;

-- inbox_wake_one: the hand-out's wake-up, after an accept or a requeue committed: unless the
-- key's lock is held (its holder's next step takes the entry), wake one live worker of the space
-- (at random) whose ear is waiting, by killing the ear's query. The ear's query starts by looking
-- for a free key with work, so an ear between two queries misses nothing. A kill that is refused
-- (another user's session) or an ear that is gone wakes nobody: a rescan finds the key.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_wake_one_v1(IN p_id BINARY(32), IN p_space BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_conn BIGINT DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_conn = NULL;
    DECLARE CONTINUE HANDLER FOR SQLEXCEPTION SET v_conn = NULL;
    IF NOT EXISTS (SELECT 1 FROM {prefix}locks
                   WHERE id = p_id AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(3)) THEN
        SELECT w.conn INTO v_conn FROM {prefix}inbox_workers AS w
        WHERE w.space = p_space AND w.expires_at > UTC_TIMESTAMP(3)
        ORDER BY RAND() LIMIT 1;
        -- only an ear that waits (a connection id could name another session after a restart)
        IF v_conn IS NOT NULL AND EXISTS (
            SELECT 1 FROM information_schema.PROCESSLIST
            WHERE ID = v_conn AND INFO LIKE '%asynclock-inbox-ear%'
        ) THEN
            KILL QUERY v_conn;
        END IF;
    END IF;
END
$$;

-- inbox_accept_v2: inbox_append_v1, then (committed) the hand-out's wake-up. One row (status,
-- pending).
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_accept_v2(
    IN p_id BINARY(32), IN p_name LONGTEXT CHARACTER SET utf8mb4, IN p_space BINARY(32),
    IN p_payload LONGTEXT CHARACTER SET utf8mb4, IN p_claim BINARY(32),
    IN p_claim_name LONGTEXT CHARACTER SET utf8mb4, IN p_claim_ttl_ms BIGINT,
    IN p_max_pending INT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_status VARCHAR(16);
    DECLARE v_pending INT;
    CALL {prefix}inbox_append_v1(p_id, p_name, p_space, p_payload, p_claim, p_claim_name,
                                 p_claim_ttl_ms, p_max_pending, v_status, v_pending);
    IF v_status = 'accepted' THEN
        CALL {prefix}inbox_wake_one_v1(p_id, p_space);
    END IF;
    SELECT v_status, v_pending;
END
$$;

-- inbox_requeue_v2: inbox_requeue_rows_v1, then (committed) the hand-out's wake-up. One row: how
-- many were put back.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_requeue_v2(IN p_id BINARY(32), IN p_space BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_moved INT;
    CALL {prefix}inbox_requeue_rows_v1(p_id, v_moved);
    IF v_moved > 0 THEN
        CALL {prefix}inbox_wake_one_v1(p_id, p_space);
    END IF;
    SELECT v_moved;
END
$$;

-- inbox_claim: the hand-out's take. As p_owner, take one key of the space that has pending entries
-- and whose lock is free (p_hint's first, else the longest waiting), for p_ttl_ms: its lock, the
-- next fencing token, and with p_take its head entry handed out (attempts + 1). Never waits for a
-- row: the lock row, then the inboxes row (the order of inbox_step and inbox_take), each FOR
-- UPDATE SKIP LOCKED, so a key another transaction is changing is passed over, and two claims
-- never take one key. Answers one row: status 'none' or 'taken' (the key's prefixed name, its
-- token, and with p_take the entry: id, attempts, payload, age in seconds, pending), and whether
-- another free key with work was seen ("more": the worker claims again at once).
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_claim_v1(
    IN p_space BINARY(32), IN p_owner VARBINARY(512), IN p_ttl_ms BIGINT, IN p_take BOOLEAN,
    IN p_hint BINARY(32)
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BINARY(32);
    DECLARE v_name LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_found INT;
    DECLARE v_free INT;
    DECLARE v_last BIGINT;
    DECLARE v_pending INT;
    DECLARE v_token BIGINT;
    DECLARE v_status VARCHAR(16) DEFAULT 'none';
    DECLARE v_taken BINARY(32);
    DECLARE v_taken_name LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_entry BIGINT;
    DECLARE v_attempts INT;
    DECLARE v_payload LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_age_us BIGINT;
    DECLARE v_more INT DEFAULT 0;
    DECLARE candidates CURSOR FOR
        SELECT c.id, c.name FROM (
            SELECT i.id, i.name, 0 AS o, i.ready_at FROM {prefix}inboxes AS i
            WHERE p_hint IS NOT NULL AND i.id = p_hint AND i.space = p_space
            UNION ALL
            SELECT i.id, i.name, 1 AS o, i.ready_at FROM {prefix}inboxes AS i
            LEFT JOIN {prefix}locks AS l ON l.id = i.id
            WHERE i.space = p_space AND i.ready_at IS NOT NULL
              AND (l.id IS NULL OR l.expires_at <= UTC_TIMESTAMP(3)
                   OR (l.owner IS NULL AND l.flag IS NULL))
        ) AS c
        ORDER BY c.o, c.ready_at
        LIMIT 17;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    OPEN candidates;
    scan: LOOP
        FETCH candidates INTO v_id, v_name;
        IF v_done = 1 THEN
            LEAVE scan;
        END IF;
        IF v_status = 'taken' THEN
            IF v_id <> v_taken THEN  -- another free key with work: claim again
                SET v_more = 1;
                LEAVE scan;
            END IF;
            ITERATE scan;
        END IF;
        -- the lock row first, without waiting: a missing row is created (and so locked by us)
        SELECT COUNT(*), COALESCE(MAX(expires_at <= UTC_TIMESTAMP(3)
                                      OR (owner IS NULL AND flag IS NULL)), 0),
               COALESCE(MAX(token), 0)
        INTO v_found, v_free, v_last
        FROM {prefix}locks WHERE id = v_id FOR UPDATE SKIP LOCKED;
        IF v_found = 0 THEN
            IF EXISTS (SELECT 1 FROM {prefix}locks WHERE id = v_id) THEN
                ITERATE scan;  -- another transaction is changing it: pass it over
            END IF;
            INSERT IGNORE INTO {prefix}locks
                (id, name, owner, flag, token, expires_at, abandoned, abandoned_until)
            VALUES (v_id, v_name, NULL, NULL, 0, '1970-01-01 00:00:00', '',
                    '1970-01-01 00:00:00');
            IF ROW_COUNT() = 0 THEN
                ITERATE scan;
            END IF;
            SET v_free = 1, v_last = 0;
        END IF;
        IF v_free = 0 THEN
            ITERATE scan;  -- held, or reserved for a waiter of another state
        END IF;
        SELECT COUNT(*), COALESCE(MAX(pending), 0) INTO v_found, v_pending
        FROM {prefix}inboxes WHERE id = v_id FOR UPDATE SKIP LOCKED;
        IF v_found = 0 OR v_pending = 0 THEN
            ITERATE scan;  -- being changed (an accept: it wakes a worker if need be), or drained
        END IF;
        SET v_token = GREATEST(v_last + 1,
                               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)));
        UPDATE {prefix}locks
        SET owner = p_owner, flag = NULL, token = v_token,
            expires_at = UTC_TIMESTAMP(3) + INTERVAL p_ttl_ms * 1000 MICROSECOND
        WHERE id = v_id;
        IF p_take THEN
            SELECT id, attempts, payload,
                   TIMESTAMPDIFF(MICROSECOND, accepted_at, UTC_TIMESTAMP(3))
            INTO v_entry, v_attempts, v_payload, v_age_us
            FROM {prefix}inbox_entries
            WHERE inbox = v_id AND error IS NULL
            ORDER BY id LIMIT 1;
            UPDATE {prefix}inbox_entries SET attempts = attempts + 1
            WHERE inbox = v_id AND id = v_entry;
            SET v_attempts = v_attempts + 1;
        END IF;
        SET v_status = 'taken', v_taken = v_id, v_taken_name = v_name;
    END LOOP;
    CLOSE candidates;
    COMMIT;
    SELECT v_status, v_taken_name, v_token, v_entry, v_attempts, v_payload,
           GREATEST(v_age_us, 0) / 1000000, v_pending, v_more;
END
$$;
