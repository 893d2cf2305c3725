-- MySQL 8 / MariaDB 10.6+ schema of MySQLState. {prefix} is the table_prefix option.
-- Every statement is idempotent; MySQLState runs them on first use (create_schema=True).
-- With create_schema=False, run this file in a migration.
-- Routine names carry a version (_v1, _v2, ...): a release that changes a body adds the next
-- version rather than altering what running processes call. This file creates only the versions
-- this release calls; those of earlier releases stay in a database where they were made (and an
-- older worker's own script makes what it calls), so both releases share the tables during a
-- rolling upgrade. Older versions can be dropped once no older worker runs.
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

-- The inbox's hand-out (EventDispatcher.serve): a key with work and no holder goes to ONE worker.
-- Each serving worker has a row here, kept alive by its lease, naming the connection of its "ear":
-- a session that waits in GET_LOCK() for work (on a name its state's anchor holds, _ear.py). An accept that finds its key free wakes one live
-- worker, chosen at random, by killing its ear's query (KILL QUERY: a user may kill the queries of
-- its own sessions); the worker then takes a key (inbox_claim).
CREATE TABLE IF NOT EXISTS {prefix}inbox_workers (
    id          VARBINARY(128) NOT NULL PRIMARY KEY, -- the worker's id ("<host>:<pid>:<random>")
    space       BINARY(32) NOT NULL,                 -- SHA-256 of the state's key prefix
    conn        BIGINT NOT NULL,                     -- CONNECTION_ID() of its ear
    expires_at  DATETIME(3) NOT NULL,                -- end of its lease
    KEY by_space (space, expires_at)
) ENGINE = InnoDB;

-- ==== Inbox retries that wait, and parked keys (SPEC 9) ========================================
-- retry_at: the key's head waits for a retry until then (set by a step or take with retry_in, the
-- lock released in the same transaction); NULL when no retry waits; kept once due until the key is
-- taken again. parked: the key stopped at a dead letter (on_poison="park") until an operator
-- requeues or discards it. A key that waits (retry_at in the future) or is parked is not handed
-- out by accepts, not listed by inbox_ready, not taken and wakes no ear; accepts still append
-- behind it. Both are columns of the key's inboxes row, so they survive every crash and change
-- under its row lock like the counters.
--
-- column_upgrade: "ALTER TABLE p_table p_add" for a table made before its newer columns existed,
-- unless p_table already has the column p_column (the first p_add adds; MySQL 8 has no ADD COLUMN
-- IF NOT EXISTS): looked up first, as ALTER TABLE copies or locks the table even when the columns
-- exist; a process that added them meanwhile (error 1060, duplicate column) leaves nothing to do.
-- Every guarded upgrade of this file is one CALL of it.
CREATE PROCEDURE IF NOT EXISTS {prefix}column_upgrade_v1(
    IN p_table VARCHAR(64), IN p_column VARCHAR(64), IN p_add TEXT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE CONTINUE HANDLER FOR 1060 BEGIN END;
    IF NOT EXISTS (SELECT 1 FROM information_schema.COLUMNS
                   WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = p_table
                     AND COLUMN_NAME = p_column) THEN
        SET @asynclock_upgrade = CONCAT('ALTER TABLE ', p_table, ' ', p_add);
        PREPARE asynclock_upgrade FROM @asynclock_upgrade;
        EXECUTE asynclock_upgrade;
        DEALLOCATE PREPARE asynclock_upgrade;
    END IF;
END
$$;

-- the two columns, to an inboxes table made before they existed
CALL {prefix}column_upgrade_v1('{prefix}inboxes', 'retry_at',
    'ADD COLUMN retry_at DATETIME(3) NULL, ADD COLUMN parked BOOLEAN NOT NULL DEFAULT FALSE');

-- inbox_lock_rows_v2: the start of inbox_step and inbox_take, inside their transaction. Locks the
-- key's lock row if p_owner holds the lock, then (only then) its inboxes row: always in that
-- order, so two steps never deadlock, and no accept can commit between a step's "empty"
-- decision and its release (an accept after it finds the key free). Aggregates make each
-- locking read answer one row, found or not (a SELECT INTO of no row would raise a warning).
-- Sets o_held (0: nothing was locked, the rest 0 too), o_rows (whether the inboxes row exists),
-- the inbox's counters, and o_retrying (1: a retry waits, or is due and not taken yet).
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_lock_rows_v2(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), OUT o_held INT, OUT o_rows INT,
    OUT o_pending INT, OUT o_dead INT, OUT o_retrying INT
)
SQL SECURITY INVOKER
$$
BEGIN
    SELECT COUNT(*) INTO o_held FROM {prefix}locks
    WHERE id = p_id AND owner = p_owner AND expires_at > UTC_TIMESTAMP(3)
    FOR UPDATE;
    SET o_rows = 0, o_pending = 0, o_dead = 0, o_retrying = 0;
    IF o_held > 0 THEN
        SELECT COUNT(*), COALESCE(MAX(pending), 0), COALESCE(MAX(dead), 0),
               COALESCE(MAX(retry_at IS NOT NULL), 0)
        INTO o_rows, o_pending, o_dead, o_retrying
        FROM {prefix}inboxes WHERE id = p_id
        FOR UPDATE;
    END IF;
END
$$;

-- inbox_release_v2: the end of inbox_step and inbox_take, inside their transaction, under the rows
-- inbox_lock_rows locked, for a key that may keep pending entries (a retry waits, or it is
-- parked): the inboxes row goes only when nothing is pending and no dead letter is left, is
-- marked idle when nothing is pending, and else stays as it is. The lock is released as the
-- release statement does: reserved for p_reservation_ms when a waiter flagged it, else free.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_release_v2(
    IN p_id BINARY(32), IN p_rows INT, IN p_pending INT, IN p_dead INT, IN p_reservation_ms BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    IF p_rows > 0 AND p_pending <= 0 AND p_dead = 0 THEN
        DELETE FROM {prefix}inboxes WHERE id = p_id;
    ELSEIF p_rows > 0 AND p_pending <= 0 THEN
        UPDATE {prefix}inboxes SET ready_at = NULL, retry_at = NULL WHERE id = p_id;
    END IF;
    UPDATE {prefix}locks
    SET owner = NULL,
        expires_at = IF(flag IS NULL, UTC_TIMESTAMP(3),
                        UTC_TIMESTAMP(3) + INTERVAL p_reservation_ms * 1000 MICROSECOND)
    WHERE id = p_id;
END
$$;

-- inbox_step_v3: as the lock's owner, finish the head (done: delete it; with dead: make it a dead
-- letter) and hand out the next entry (attempts + 1 unless only looked at), or, when none is
-- pending, release the lock (inbox_release_v2) in the same transaction. Starts with
-- inbox_lock_rows_v2 (the lock row, then the inboxes row). With p_retry_ms (and p_done, the
-- head): the head stays pending with its attempt count, the key's retry is due p_retry_ms from
-- now (server clock), and the lock is released. With p_park (and p_done, p_dead): the head
-- becomes a dead letter, the key is parked, and the lock is released. Otherwise the holder's step
-- hands out the head whatever the key's state (the claim that gave it the lock decided that), and
-- ends a retry's wait (retry_at cleared). Answers one row (status, entry, attempts, payload, age
-- in seconds, pending); status 'not_owner' changed nothing, 'released' released the lock.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_step_v3(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), IN p_done BIGINT,
    IN p_dead LONGTEXT CHARACTER SET utf8mb4, IN p_take BOOLEAN, IN p_retry_ms BIGINT,
    IN p_park BOOLEAN, IN p_reservation_ms BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_held INT;
    DECLARE v_rows INT;
    DECLARE v_pending INT;
    DECLARE v_dead INT;
    DECLARE v_retrying INT;
    DECLARE v_closed INT DEFAULT 0;
    DECLARE v_entry BIGINT;
    DECLARE v_attempts INT;
    DECLARE v_payload LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_age_us BIGINT;
    DECLARE v_status VARCHAR(16) DEFAULT 'released';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    CALL {prefix}inbox_lock_rows_v2(p_id, p_owner, v_held, v_rows, v_pending, v_dead, v_retrying);
    IF v_held = 0 THEN
        SET v_status = 'not_owner';
    ELSE
        IF v_rows > 0 AND p_done IS NOT NULL AND p_retry_ms IS NOT NULL THEN
            -- the head stays where it is, attempts unchanged; the key waits, no lock held
            UPDATE {prefix}inboxes
            SET retry_at = UTC_TIMESTAMP(3) + INTERVAL p_retry_ms * 1000 MICROSECOND
            WHERE id = p_id;
            SET v_closed = 1;
        ELSEIF v_rows > 0 AND p_done IS NOT NULL THEN
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
            IF p_park AND p_dead IS NOT NULL THEN
                UPDATE {prefix}inboxes SET parked = TRUE, retry_at = NULL WHERE id = p_id;
                SET v_closed = 1;
            END IF;
        END IF;
        IF v_pending > 0 AND v_closed = 0 THEN
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
            IF v_retrying > 0 THEN  -- its holder hands the head out: no retry waits any more
                UPDATE {prefix}inboxes SET retry_at = NULL WHERE id = p_id;
            END IF;
            SET v_status = 'entry';
        ELSE
            CALL {prefix}inbox_release_v2(p_id, v_rows, v_pending, v_dead, p_reservation_ms);
        END IF;
    END IF;
    COMMIT;
    SELECT v_status, v_entry, v_attempts, v_payload, GREATEST(v_age_us, 0) / 1000000, v_pending;
END
$$;

-- inbox_take_v3: the batch form of inbox_step. As the lock's owner, finish the pending entries whose
-- ids p_done lists (comma-separated; deleted, or dead letters with the error p_dead, wherever
-- they are in the inbox), then hand out the oldest p_limit pending entries (attempts + 1; ending a
-- retry's wait), or, when none is pending, release the lock as inbox_step does, in the same
-- transaction (lock row, then inboxes row: no deadlock, no accept stranded). With p_retry_ms the
-- entries p_done lists stay pending with their attempt counts and the key's retry is due
-- p_retry_ms from now; with p_park (and p_dead) they become dead letters and the key is parked;
-- either way the lock is released ('released'). Answers one result set, read before the commit
-- (so an accept landing after it cannot show up uncounted): a first row (status, -, -, -, seconds
-- since the newest pending entry was accepted, pending) with status 'not_owner' (nothing
-- changed), 'released' or 'pending', then one row ('entry', id, attempts, payload, age in
-- seconds, pending) per entry handed out, in id order.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_take_v3(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), IN p_done LONGTEXT,
    IN p_dead LONGTEXT CHARACTER SET utf8mb4, IN p_limit INT, IN p_retry_ms BIGINT,
    IN p_park BOOLEAN, IN p_reservation_ms BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_held INT;
    DECLARE v_rows INT;
    DECLARE v_pending INT DEFAULT 0;
    DECLARE v_dead INT;
    DECLARE v_retrying INT;
    DECLARE v_closed INT DEFAULT 0;
    DECLARE v_gone INT;
    DECLARE v_status VARCHAR(16) DEFAULT 'released';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    CALL {prefix}inbox_lock_rows_v2(p_id, p_owner, v_held, v_rows, v_pending, v_dead, v_retrying);
    IF v_held = 0 THEN
        SET v_status = 'not_owner';
    ELSE
        IF v_rows > 0 AND p_done <> '' AND p_retry_ms IS NOT NULL THEN
            UPDATE {prefix}inboxes
            SET retry_at = UTC_TIMESTAMP(3) + INTERVAL p_retry_ms * 1000 MICROSECOND
            WHERE id = p_id;
            SET v_closed = 1;
        ELSEIF v_rows > 0 AND p_done <> '' THEN
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
            IF p_park AND p_dead IS NOT NULL THEN
                UPDATE {prefix}inboxes SET parked = TRUE, retry_at = NULL WHERE id = p_id;
                SET v_closed = 1;
            END IF;
        END IF;
        IF v_pending > 0 AND v_closed = 0 THEN
            UPDATE {prefix}inbox_entries SET attempts = attempts + 1
            WHERE inbox = p_id AND error IS NULL
            ORDER BY id LIMIT p_limit;
            IF v_retrying > 0 AND p_limit > 0 THEN  -- its holder hands entries out: no retry waits
                UPDATE {prefix}inboxes SET retry_at = NULL WHERE id = p_id;
            END IF;
            SET v_status = 'pending';
        ELSE
            CALL {prefix}inbox_release_v2(p_id, v_rows, v_pending, v_dead, p_reservation_ms);
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

-- inbox_requeue_rows_v2: put the key's dead letters back at the head of its inbox, in id (accept)
-- order, with fresh attempt counts, and unpark the key, in a transaction of its own (a retry that
-- waits still holds the key until due). Locks the key's inboxes row first, as accept and step do,
-- so the counters stay exact. Sets o_moved: how many were put back.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_requeue_rows_v2(IN p_id BINARY(32), OUT o_moved INT)
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
        UPDATE {prefix}inboxes SET parked = FALSE WHERE id = p_id AND parked;
    END IF;
    COMMIT;
END
$$;

-- inbox_requeue_v4: inbox_requeue_rows_v2 (the dead letters back at the head, attempts from 0, so
-- the next delivery is attempt 1; the key unparked), then (committed) the hand-out's wake-up if
-- the key has work and is open (inbox_hand_out_v2). One row: how many were put back.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_requeue_v4(IN p_id BINARY(32), IN p_space BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_moved INT;
    CALL {prefix}inbox_requeue_rows_v2(p_id, v_moved);
    CALL {prefix}inbox_hand_out_v2(p_id, p_space);
    SELECT v_moved;
END
$$;

-- inbox_discard_v2: delete the key's dead letters and unpark it, in one transaction under its
-- inboxes row lock (taken first, as every inbox change does); the row goes when nothing is left.
-- Then (committed) the hand-out's wake-up if the key has work and is open (inbox_hand_out_v2).
-- One row: how many were deleted.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_discard_v2(IN p_id BINARY(32), IN p_space BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_rows INT;
    DECLARE v_pending INT;
    DECLARE v_gone INT DEFAULT 0;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT COUNT(*), COALESCE(MAX(pending), 0) INTO v_rows, v_pending
    FROM {prefix}inboxes WHERE id = p_id FOR UPDATE;
    IF v_rows > 0 THEN
        DELETE FROM {prefix}inbox_entries WHERE inbox = p_id AND error IS NOT NULL;
        SET v_gone = ROW_COUNT();
        IF v_pending = 0 THEN
            DELETE FROM {prefix}inboxes WHERE id = p_id;
        ELSE
            UPDATE {prefix}inboxes SET dead = 0, parked = FALSE WHERE id = p_id;
        END IF;
    END IF;
    COMMIT;
    IF v_pending > 0 THEN
        CALL {prefix}inbox_hand_out_v2(p_id, p_space);
    END IF;
    SELECT v_gone;
END
$$;

-- ==== The hand-out's hint (#24): a woken worker's key, that no other worker's ear answers ========
-- inbox_ear once answered at once whenever any free key had work: so a worker re-arming its ear
-- claimed the key another worker had just been woken for, and one of the two claims found nothing
-- (about one event in three at 4 workers). Now the waker writes the key into the woken worker's
-- row (hint) before it kills the ear's query; the ear answers at once only for a hint in its own
-- row (a kill that lands between two of its statements is made up for by the next one), and the
-- worker's claim takes its hint first. Keys nobody was told about (a kill refused, a worker gone
-- with its hint) are found by each worker's rescan and by the claim every ear timeout makes.
--
-- the hint column, to an inbox_workers table made before it existed
CALL {prefix}column_upgrade_v1('{prefix}inbox_workers', 'hint', 'ADD COLUMN hint BINARY(32) NULL');

-- inbox_wake_one_v2: the hand-out's wake-up, after an accept, a requeue or a discard committed:
-- unless the key's lock is held (its holder's next step takes the entry), pick one live worker of
-- the space at random, one with no hint waiting first, write the key as its hint (committed
-- before the kill: the ear's next look sees it), then kill its ear's query if it waits
-- (ear_kill_v1: a connection id could name another session after a restart). A kill that is
-- refused (another user's session), a worker gone with its hint, or a wake-up that failed (it is
-- best effort: the accept committed before it) leaves the key to a rescan.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_wake_one_v2(IN p_id BINARY(32), IN p_space BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_worker VARBINARY(128) DEFAULT NULL;
    DECLARE v_conn BIGINT DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_worker = NULL;
    DECLARE CONTINUE HANDLER FOR SQLEXCEPTION SET v_worker = NULL;
    IF NOT EXISTS (SELECT 1 FROM {prefix}locks
                   WHERE id = p_id AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(3)) THEN
        SELECT w.id, w.conn INTO v_worker, v_conn FROM {prefix}inbox_workers AS w
        WHERE w.space = p_space AND w.expires_at > UTC_TIMESTAMP(3)
        ORDER BY w.hint IS NOT NULL, RAND() LIMIT 1;
        IF v_worker IS NOT NULL THEN
            UPDATE {prefix}inbox_workers SET hint = p_id WHERE id = v_worker;
        END IF;
        IF v_worker IS NOT NULL THEN  -- the hint is written
            CALL {prefix}ear_kill_v1(v_conn, 'asynclock-inbox-ear');
        END IF;
    END IF;
END
$$;

-- inbox_hand_out_v2: the hand-out's wake-up (inbox_wake_one_v2, which passes over a held key) for a
-- key that has pending entries and is open: neither parked nor waiting for a retry not due yet.
-- After an accept, a requeue or a discard committed.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_hand_out_v2(IN p_id BINARY(32), IN p_space BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    IF EXISTS (SELECT 1 FROM {prefix}inboxes
               WHERE id = p_id AND pending > 0 AND NOT parked
                 AND (retry_at IS NULL OR retry_at <= UTC_TIMESTAMP(3))) THEN
        CALL {prefix}inbox_wake_one_v2(p_id, p_space);
    END IF;
END
$$;

-- inbox_accept_v4: inbox_append_v1, then (committed) the hand-out's wake-up through
-- inbox_hand_out_v2 for a key that is free and open (neither waiting for its retry nor parked: a
-- worker woken for it could not take it): the key written into the woken worker's row. One row
-- (status, pending).
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_accept_v4(
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
        CALL {prefix}inbox_hand_out_v2(p_id, p_space);
    END IF;
    SELECT v_status, v_pending;
END
$$;

-- inbox_claim_v4: the hand-out's take, for worker p_worker. Its hint first (the key a wake-up
-- wrote in its row), consumed, after p_hint if given. Then as p_owner, take one key of the space
-- that has pending entries, whose lock is free, that is neither parked nor waiting for a retry
-- not due yet, nor promised to another live worker (its hint: that worker is about to claim it,
-- and a worker claiming again for "more" would leave its claim with nothing), the longest waiting
-- first, for p_ttl_ms: its lock, the next fencing token, and with p_take its head entry handed
-- out (attempts + 1); a retry it takes no longer waits. A rescan's take names its key (p_hint),
-- so a key promised to a worker gone without saying so is still taken. Never waits for a key's
-- row: the lock row, then the inboxes row (the order of inbox_step and inbox_take), each FOR
-- UPDATE SKIP LOCKED, so a key another transaction is changing is passed over, and two claims
-- never take one key; the key's state is checked again under the inboxes row lock. Answers one
-- row: status 'none' or 'taken' (the key's prefixed name, its token, and with p_take the entry:
-- id, attempts, payload, age in seconds, pending), and whether another free key with work,
-- promised to nobody else, was seen ("more": the worker claims again at once).
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_claim_v4(
    IN p_space BINARY(32), IN p_owner VARBINARY(512), IN p_ttl_ms BIGINT, IN p_take BOOLEAN,
    IN p_hint BINARY(32), IN p_worker VARBINARY(128)
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
    DECLARE v_closed INT;
    DECLARE v_retrying INT;
    DECLARE v_token BIGINT;
    DECLARE v_status VARCHAR(16) DEFAULT 'none';
    DECLARE v_taken BINARY(32);
    DECLARE v_taken_name LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_entry BIGINT;
    DECLARE v_attempts INT;
    DECLARE v_payload LONGTEXT CHARACTER SET utf8mb4;
    DECLARE v_age_us BIGINT;
    DECLARE v_more INT DEFAULT 0;
    DECLARE v_hint BINARY(32) DEFAULT NULL;
    DECLARE candidates CURSOR FOR
        SELECT c.id, c.name FROM (
            SELECT i.id, i.name, 0 AS o, i.ready_at FROM {prefix}inboxes AS i
            WHERE p_hint IS NOT NULL AND i.id = p_hint AND i.space = p_space
            UNION ALL
            SELECT i.id, i.name, 1 AS o, i.ready_at FROM {prefix}inboxes AS i
            LEFT JOIN {prefix}locks AS l ON l.id = i.id
            WHERE i.space = p_space AND i.ready_at IS NOT NULL
              AND NOT i.parked AND (i.retry_at IS NULL OR i.retry_at <= UTC_TIMESTAMP(3))
              AND (l.id IS NULL OR l.expires_at <= UTC_TIMESTAMP(3)
                   OR (l.owner IS NULL AND l.flag IS NULL))
              AND NOT EXISTS (SELECT 1 FROM {prefix}inbox_workers AS w
                              WHERE w.space = p_space AND w.hint = i.id AND w.id <> p_worker
                                AND w.expires_at > UTC_TIMESTAMP(3))
        ) AS c
        ORDER BY c.o, c.ready_at
        LIMIT 17;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    -- the worker's hint first, consumed (cleared only if still the one read: a newer wake-up's
    -- stays); the cursor reads p_hint when it opens
    SELECT hint INTO v_hint FROM {prefix}inbox_workers WHERE id = p_worker AND hint IS NOT NULL;
    SET v_done = 0;  -- a worker without a row (or a hint) is NOT FOUND: not the scan's end
    IF v_hint IS NOT NULL THEN
        UPDATE {prefix}inbox_workers SET hint = NULL WHERE id = p_worker AND hint = v_hint;
        SET p_hint = COALESCE(p_hint, v_hint);
    END IF;
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
        SELECT COUNT(*), COALESCE(MAX(pending), 0),
               COALESCE(MAX(parked OR retry_at > UTC_TIMESTAMP(3)), 0),
               COALESCE(MAX(retry_at IS NOT NULL), 0)
        INTO v_found, v_pending, v_closed, v_retrying
        FROM {prefix}inboxes WHERE id = v_id FOR UPDATE SKIP LOCKED;
        IF v_found = 0 OR v_pending = 0 OR v_closed > 0 THEN
            ITERATE scan;  -- being changed (an accept: it wakes a worker if need be), drained or closed
        END IF;
        SET v_token = GREATEST(v_last + 1,
                               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)));
        UPDATE {prefix}locks
        SET owner = p_owner, flag = NULL, token = v_token,
            expires_at = UTC_TIMESTAMP(3) + INTERVAL p_ttl_ms * 1000 MICROSECOND
        WHERE id = v_id;
        IF v_retrying > 0 THEN  -- the retry is taken: it no longer waits
            UPDATE {prefix}inboxes SET retry_at = NULL WHERE id = v_id;
        END IF;
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

-- inbox_worker_gone_v1: a worker stops serving: its row goes, and a hint it had not claimed yet
-- is handed to another live worker (inbox_hand_out_v2), not left to the rescans.
CREATE PROCEDURE IF NOT EXISTS {prefix}inbox_worker_gone_v1(IN p_worker VARBINARY(128))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_hint BINARY(32) DEFAULT NULL;
    DECLARE v_space BINARY(32) DEFAULT NULL;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_hint = NULL;
    SELECT hint, space INTO v_hint, v_space FROM {prefix}inbox_workers WHERE id = p_worker;
    DELETE FROM {prefix}inbox_workers WHERE id = p_worker;
    IF v_hint IS NOT NULL THEN
        CALL {prefix}inbox_hand_out_v2(v_hint, v_space);
    END IF;
END
$$;

-- ==== Semaphores (asynclock.Semaphore, the SemaphoreState capability) ==========================
-- Separate from the lock and inbox tables: a semaphore key is a namespace of its own. Every
-- operation on a key first locks its row of {prefix}semaphores (created on first use), so the
-- operations of one key run one after another in every process; the row keeps the last
-- fencing token and the last queue number, and stays after the key goes idle (purge_expired()
-- deletes it token_retention after its last use). Procedure names are versioned (_v1, _v2, ...).
CREATE TABLE IF NOT EXISTS {prefix}semaphores (
    id          BINARY(32) NOT NULL PRIMARY KEY,     -- SHA-256 of the prefixed key
    name        LONGTEXT CHARACTER SET utf8mb4 NOT NULL,  -- the prefixed key itself
    token       BIGINT NOT NULL,                     -- the last fencing token issued
    seq         BIGINT NOT NULL,                     -- the last queue number given out
    touched_at  DATETIME(3) NOT NULL                 -- the last acquire or place (for purge)
) ENGINE = InnoDB;

-- The permits held: one row per holder, gone when released or (lazily) expired.
CREATE TABLE IF NOT EXISTS {prefix}semaphore_holders (
    semaphore   BINARY(32) NOT NULL,                 -- semaphores.id
    owner       VARBINARY(512) NOT NULL,
    token       BIGINT NOT NULL,
    expires_at  DATETIME(3) NOT NULL,
    PRIMARY KEY (semaphore, owner)
) ENGINE = InnoDB;

-- The queue of waiters, in seq (arrival) order; a place is kept until "until". A row with
-- gone = 1 is an abandon mark (an acquire of that owner still on the wire must fail), not a
-- waiter; it lives until "until" as well.
CREATE TABLE IF NOT EXISTS {prefix}semaphore_waiters (
    semaphore   BINARY(32) NOT NULL,                 -- semaphores.id
    owner       VARBINARY(512) NOT NULL,
    seq         BIGINT NOT NULL,
    permits     INT NOT NULL,                        -- the limit it waits with
    until       DATETIME(3) NOT NULL,
    gone        TINYINT NOT NULL DEFAULT 0,
    PRIMARY KEY (semaphore, owner),
    KEY by_order (semaphore, seq)
) ENGINE = InnoDB;

-- Push wake-ups across processes (MySQL has no NOTIFY): a waiting state keeps an "ear", a
-- connection of its own parked in a marked GET_LOCK (the semaphore_ear query). A place whose state
-- has an ear has a row here naming the ear's CONNECTION_ID(), written by the acquire that queues
-- it. A release or abandon that makes waiters eligible marks their rows (woken = 1) and, after
-- its commit, interrupts each of their ears once (KILL QUERY); the ear's statement first looks
-- for marked rows of its own (a kill between two statements is made up for), then collects and
-- deletes them (semaphore_heard_v1) and wakes those waiters only. A row lives as its place does.
CREATE TABLE IF NOT EXISTS {prefix}semaphore_ears (
    semaphore   BINARY(32) NOT NULL,                 -- semaphores.id
    owner       VARBINARY(512) NOT NULL,             -- the waiter
    conn        BIGINT NOT NULL,                     -- CONNECTION_ID() of its state's ear
    woken       TINYINT NOT NULL DEFAULT 0,          -- 1: made eligible, not collected yet
    until       DATETIME(3) NOT NULL,                -- as its place's (purge)
    PRIMARY KEY (semaphore, owner),
    KEY by_conn (conn, woken)
) ENGINE = InnoDB;

-- ear_kill: interrupt the statement of connection p_conn if it is an ear waiting in a statement
-- marked p_marker (a connection id could name another session after a restart, and an ear
-- between two statements has nothing to interrupt: its next statement looks first). A kill
-- refused (another user's session, without CONNECTION_ADMIN) wakes nobody: the waiter's own
-- bounded wait makes up for it.
CREATE PROCEDURE IF NOT EXISTS {prefix}ear_kill_v1(IN p_conn BIGINT, IN p_marker VARCHAR(64))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
    IF EXISTS (SELECT 1 FROM information_schema.PROCESSLIST
               WHERE ID = p_conn AND INFO LIKE CONCAT('%', p_marker, '%')) THEN
        KILL QUERY p_conn;
    END IF;
END
$$;

-- semaphore_mark: inside a release's or abandon's transaction, after it made the owners in
-- p_fresh (one per line) eligible: mark their ear rows, except those naming p_ear (the caller's
-- own ear: its state wakes them in process), and answer the ears to interrupt, each once, one
-- per line in o_ears.
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_mark_v1(
    IN p_id BINARY(32), IN p_fresh LONGBLOB, IN p_ear BIGINT, OUT o_ears LONGBLOB
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_rest LONGBLOB DEFAULT p_fresh;
    DECLARE v_line LONGBLOB;
    DECLARE v_conn BIGINT;
    SET o_ears = '';
    WHILE LENGTH(v_rest) > 0 DO
        SET v_line = SUBSTRING_INDEX(v_rest, CHAR(10), 1);
        SET v_rest = SUBSTRING(v_rest, LENGTH(v_line) + 2);
        SELECT MAX(conn) INTO v_conn FROM {prefix}semaphore_ears
        WHERE semaphore = p_id AND owner = v_line AND (p_ear IS NULL OR conn <> p_ear);
        IF v_conn IS NOT NULL THEN
            UPDATE {prefix}semaphore_ears SET woken = 1
            WHERE semaphore = p_id AND owner = v_line;
            IF LOCATE(CONCAT(CHAR(10), v_conn, CHAR(10)), CONCAT(CHAR(10), o_ears)) = 0 THEN
                SET o_ears = CONCAT(o_ears, v_conn, CHAR(10));
            END IF;
        END IF;
    END WHILE;
END
$$;

-- semaphore_ring: after the commit of what semaphore_mark_v1 marked, interrupt each ear of
-- p_ears (one connection id per line).
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_ring_v1(IN p_ears LONGBLOB)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_rest LONGBLOB DEFAULT p_ears;
    DECLARE v_line LONGBLOB;
    WHILE LENGTH(v_rest) > 0 DO
        SET v_line = SUBSTRING_INDEX(v_rest, CHAR(10), 1);
        SET v_rest = SUBSTRING(v_rest, LENGTH(v_line) + 2);
        CALL {prefix}ear_kill_v1(CAST(v_line AS UNSIGNED), 'asynclock-semaphore-ear');
    END WHILE;
END
$$;

-- semaphore_heard: what an ear (this session) collects once interrupted: its marked rows,
-- deleted in the same transaction (a row marked meanwhile is not read, so not deleted: the
-- next look finds it). One row: "<key id hex>:<owner>" per line. A failure drops the ear's
-- connection (its transaction rolls back), and its state wakes all its waiters.
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_heard_v1()
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_id BINARY(32);
    DECLARE v_owner VARBINARY(512);
    DECLARE v_heard LONGBLOB DEFAULT '';
    DECLARE v_at INT DEFAULT 0;
    DECLARE v_marked CURSOR FOR
        SELECT semaphore, owner FROM {prefix}semaphore_ears
        WHERE conn = CONNECTION_ID() AND woken = 1 FOR UPDATE;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    OPEN v_marked;
    walk: LOOP
        FETCH v_marked INTO v_id, v_owner;
        IF v_done = 1 THEN
            LEAVE walk;
        END IF;
        SET v_heard = CONCAT(v_heard, LOWER(HEX(v_id)), ':', v_owner, CHAR(10));
    END LOOP;
    CLOSE v_marked;
    -- the rows read are locked: delete exactly those (by their key), not rows marked since
    WHILE v_at < LENGTH(v_heard) DO  -- each line: 64 hex digits, ':', the owner, a newline
        SET v_id = UNHEX(SUBSTRING(v_heard, v_at + 1, 64));
        SET v_owner = SUBSTRING_INDEX(SUBSTRING(v_heard, v_at + 66), CHAR(10), 1);
        DELETE FROM {prefix}semaphore_ears
        WHERE semaphore = v_id AND owner = v_owner AND conn = CONNECTION_ID();
        SET v_at = v_at + 66 + LENGTH(v_owner);
    END WHILE;
    COMMIT;
    SELECT v_heard;
END
$$;

-- semaphore_eligible: the waiters at the head of the key's queue that may take a permit with
-- p_held permits taken (each, and every one ahead of it, fits p_held + position < its limit),
-- oldest first, one per line in o_owners, and how many (o_count). The walk stops at the first
-- that does not fit. Called inside a routine that holds the key's row lock.
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_eligible_v1(
    IN p_id BINARY(32), IN p_held INT, OUT o_owners LONGBLOB, OUT o_count INT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_done INT DEFAULT 0;
    DECLARE v_owner VARBINARY(512);
    DECLARE v_permits INT;
    DECLARE v_waiters CURSOR FOR
        SELECT owner, permits FROM {prefix}semaphore_waiters
        WHERE semaphore = p_id AND gone = 0 AND until > UTC_TIMESTAMP(3) ORDER BY seq;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    SET o_owners = '', o_count = 0;
    OPEN v_waiters;
    walk: LOOP
        FETCH v_waiters INTO v_owner, v_permits;
        IF v_done = 1 OR p_held + o_count >= v_permits THEN
            LEAVE walk;
        END IF;
        SET o_owners = CONCAT(o_owners, v_owner, CHAR(10)), o_count = o_count + 1;
    END LOOP;
    CLOSE v_waiters;
END
$$;

-- semaphore_fresh: the owners (one per line) eligible now, under the key's row lock, that were
-- not in p_before (one per line): those a release or abandon must wake.
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_fresh_v1(
    IN p_id BINARY(32), IN p_before LONGBLOB, OUT o_fresh LONGBLOB
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_held INT;
    DECLARE v_now LONGBLOB;
    DECLARE v_count INT;
    DECLARE v_line LONGBLOB;
    SELECT COUNT(*) INTO v_held FROM {prefix}semaphore_holders WHERE semaphore = p_id;
    CALL {prefix}semaphore_eligible_v1(p_id, v_held, v_now, v_count);
    SET o_fresh = '';
    WHILE LENGTH(v_now) > 0 DO
        SET v_line = SUBSTRING_INDEX(v_now, CHAR(10), 1);
        SET v_now = SUBSTRING(v_now, LENGTH(v_line) + 2);
        IF LOCATE(CONCAT(CHAR(10), v_line, CHAR(10)), CONCAT(CHAR(10), p_before)) = 0 THEN
            SET o_fresh = CONCAT(o_fresh, v_line, CHAR(10));
        END IF;
    END WHILE;
END
$$;

-- semaphore_acquire: take a permit for p_owner if one is free in turn (see SemaphoreState);
-- with p_hold_ms > 0, on refusal join the queue (or keep the place) for p_hold_ms, reached
-- through ear p_ear (a connection id; NULL: none, its state polls). Answers one row after the
-- commit: the token, or NULL and the seconds until a permit or a place ahead expires.
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_acquire_v2(
    IN p_id BINARY(32), IN p_name LONGTEXT CHARACTER SET utf8mb4, IN p_owner VARBINARY(512),
    IN p_limit INT, IN p_ttl_ms BIGINT, IN p_hold_ms BIGINT, IN p_ear BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_now DATETIME(3);
    DECLARE v_token BIGINT;
    DECLARE v_seq BIGINT;
    DECLARE v_mine BIGINT DEFAULT NULL;
    DECLARE v_my_seq BIGINT DEFAULT NULL;
    DECLARE v_gone INT DEFAULT 0;
    DECLARE v_held INT;
    DECLARE v_position INT;
    DECLARE v_fits INT;
    DECLARE v_list LONGBLOB;
    DECLARE v_count INT;
    DECLARE v_first DATETIME(3) DEFAULT NULL;
    DECLARE v_ahead DATETIME(3) DEFAULT NULL;
    DECLARE v_out_token BIGINT DEFAULT NULL;
    DECLARE v_out_retry DOUBLE DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    -- locks the key's row exclusively, inserted or not
    INSERT INTO {prefix}semaphores (id, name, token, seq, touched_at)
    VALUES (p_id, p_name, 0, 0, UTC_TIMESTAMP(3))
    ON DUPLICATE KEY UPDATE touched_at = UTC_TIMESTAMP(3);
    SET v_now = UTC_TIMESTAMP(3);
    SELECT token, seq INTO v_token, v_seq FROM {prefix}semaphores WHERE id = p_id;
    DELETE FROM {prefix}semaphore_holders WHERE semaphore = p_id AND expires_at <= v_now;
    DELETE FROM {prefix}semaphore_waiters WHERE semaphore = p_id AND until <= v_now;
    DELETE FROM {prefix}semaphore_ears WHERE semaphore = p_id AND until <= v_now;
    SELECT MAX(token) INTO v_mine FROM {prefix}semaphore_holders
    WHERE semaphore = p_id AND owner = p_owner;
    SELECT COALESCE(MAX(gone), 0), MAX(seq) INTO v_gone, v_my_seq FROM {prefix}semaphore_waiters
    WHERE semaphore = p_id AND owner = p_owner;
    IF v_mine IS NOT NULL THEN
        -- a repeated call that won already: the same token, its TTL reset from now
        UPDATE {prefix}semaphore_holders
        SET expires_at = v_now + INTERVAL p_ttl_ms * 1000 MICROSECOND
        WHERE semaphore = p_id AND owner = p_owner;
        SET v_out_token = v_mine;
    ELSEIF v_gone > 0 THEN
        -- given up (semaphore_abandon ran first): never granted, never queued
        SET v_out_retry = p_ttl_ms / 1000.0;
    ELSE
        SELECT COUNT(*) INTO v_held FROM {prefix}semaphore_holders WHERE semaphore = p_id;
        SELECT COUNT(*) INTO v_position FROM {prefix}semaphore_waiters
        WHERE semaphore = p_id AND gone = 0 AND (v_my_seq IS NULL OR seq < v_my_seq);
        SET v_fits = v_held + v_position < p_limit;
        IF v_fits AND v_position > 0 THEN  -- everyone ahead fits too
            CALL {prefix}semaphore_eligible_v1(p_id, v_held, v_list, v_count);
            SET v_fits = v_count >= v_position;
        END IF;
        IF v_fits THEN
            DELETE FROM {prefix}semaphore_waiters WHERE semaphore = p_id AND owner = p_owner;
            DELETE FROM {prefix}semaphore_ears WHERE semaphore = p_id AND owner = p_owner;
            SET v_token = GREATEST(v_token + 1,
                TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6)));
            UPDATE {prefix}semaphores SET token = v_token WHERE id = p_id;
            INSERT INTO {prefix}semaphore_holders (semaphore, owner, token, expires_at)
            VALUES (p_id, p_owner, v_token, v_now + INTERVAL p_ttl_ms * 1000 MICROSECOND);
            SET v_out_token = v_token;
        ELSE
            IF p_hold_ms > 0 THEN
                IF v_my_seq IS NULL THEN
                    SET v_seq = v_seq + 1, v_my_seq = v_seq;
                    UPDATE {prefix}semaphores SET seq = v_seq WHERE id = p_id;
                    INSERT INTO {prefix}semaphore_waiters (semaphore, owner, seq, permits, until)
                    VALUES (p_id, p_owner, v_seq, p_limit,
                            v_now + INTERVAL p_hold_ms * 1000 MICROSECOND);
                ELSE
                    UPDATE {prefix}semaphore_waiters
                    SET until = v_now + INTERVAL p_hold_ms * 1000 MICROSECOND, permits = p_limit
                    WHERE semaphore = p_id AND owner = p_owner;
                END IF;
                -- the place's ear, unmarked: this refusal is the latest news for the waiter
                IF p_ear IS NULL THEN
                    DELETE FROM {prefix}semaphore_ears WHERE semaphore = p_id AND owner = p_owner;
                ELSE
                    INSERT INTO {prefix}semaphore_ears (semaphore, owner, conn, woken, until)
                    VALUES (p_id, p_owner, p_ear, 0,
                            v_now + INTERVAL p_hold_ms * 1000 MICROSECOND)
                    ON DUPLICATE KEY UPDATE conn = VALUES(conn), woken = 0,
                                            until = VALUES(until);
                END IF;
            END IF;
            SELECT MIN(expires_at) INTO v_first FROM {prefix}semaphore_holders
            WHERE semaphore = p_id;
            SELECT MIN(a.until) INTO v_ahead FROM (
                SELECT until FROM {prefix}semaphore_waiters
                WHERE semaphore = p_id AND gone = 0 AND (v_my_seq IS NULL OR seq < v_my_seq)
                ORDER BY seq LIMIT p_limit) AS a;
            IF v_first IS NULL OR (v_ahead IS NOT NULL AND v_ahead < v_first) THEN
                SET v_first = v_ahead;
            END IF;
            SET v_out_retry = IF(v_first IS NULL, p_ttl_ms / 1000.0,
                                 GREATEST(TIMESTAMPDIFF(MICROSECOND, v_now, v_first), 0) / 1e6);
        END IF;
    END IF;
    COMMIT;
    SELECT v_out_token, v_out_retry;
END
$$;

-- semaphore_release: give back p_owner's permit, and ring the ears of the waiters that made
-- eligible (but p_ear, the caller's). Answers one row after the commit: (owned, those waiters,
-- one per line; a permit that expired meanwhile counts too).
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_release_v2(
    IN p_id BINARY(32), IN p_owner VARBINARY(512), IN p_ear BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_rows INT;
    DECLARE v_held INT;
    DECLARE v_before LONGBLOB;
    DECLARE v_count INT;
    DECLARE v_owned INT DEFAULT 0;
    DECLARE v_fresh LONGBLOB DEFAULT '';
    DECLARE v_ears LONGBLOB DEFAULT '';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT COUNT(*) INTO v_rows FROM {prefix}semaphores WHERE id = p_id FOR UPDATE;
    IF v_rows > 0 THEN
        SELECT COUNT(*) INTO v_held FROM {prefix}semaphore_holders WHERE semaphore = p_id;
        CALL {prefix}semaphore_eligible_v1(p_id, v_held, v_before, v_count);
        SELECT COUNT(*) INTO v_owned FROM {prefix}semaphore_holders
        WHERE semaphore = p_id AND owner = p_owner AND expires_at > UTC_TIMESTAMP(3);
        DELETE FROM {prefix}semaphore_holders
        WHERE semaphore = p_id AND (owner = p_owner OR expires_at <= UTC_TIMESTAMP(3));
        CALL {prefix}semaphore_fresh_v1(p_id, v_before, v_fresh);
        CALL {prefix}semaphore_mark_v1(p_id, v_fresh, p_ear, v_ears);
    END IF;
    COMMIT;
    CALL {prefix}semaphore_ring_v1(v_ears);
    SELECT v_owned, v_fresh;
END
$$;

-- semaphore_abandon: undo an acquire of unknown outcome, or stop waiting: give back p_owner's
-- permit, take it out of the queue and leave its mark for p_mark_ms (a late acquire then fails).
-- Rings the ears of the waiters this made eligible (but p_ear, the caller's). Answers one row
-- after the commit: those waiters, one per line.
CREATE PROCEDURE IF NOT EXISTS {prefix}semaphore_abandon_v2(
    IN p_id BINARY(32), IN p_name LONGTEXT CHARACTER SET utf8mb4, IN p_owner VARBINARY(512),
    IN p_mark_ms BIGINT, IN p_ear BIGINT
)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_held INT;
    DECLARE v_before LONGBLOB;
    DECLARE v_count INT;
    DECLARE v_fresh LONGBLOB DEFAULT '';
    DECLARE v_ears LONGBLOB DEFAULT '';
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    INSERT INTO {prefix}semaphores (id, name, token, seq, touched_at)
    VALUES (p_id, p_name, 0, 0, UTC_TIMESTAMP(3))
    ON DUPLICATE KEY UPDATE touched_at = UTC_TIMESTAMP(3);
    SELECT COUNT(*) INTO v_held FROM {prefix}semaphore_holders WHERE semaphore = p_id;
    CALL {prefix}semaphore_eligible_v1(p_id, v_held, v_before, v_count);
    DELETE FROM {prefix}semaphore_ears WHERE semaphore = p_id AND owner = p_owner;
    DELETE FROM {prefix}semaphore_holders
    WHERE semaphore = p_id AND (owner = p_owner OR expires_at <= UTC_TIMESTAMP(3));
    INSERT INTO {prefix}semaphore_waiters (semaphore, owner, seq, permits, until, gone)
    VALUES (p_id, p_owner, 0, 0, UTC_TIMESTAMP(3) + INTERVAL p_mark_ms * 1000 MICROSECOND, 1)
    ON DUPLICATE KEY UPDATE gone = 1, until = VALUES(until);
    CALL {prefix}semaphore_fresh_v1(p_id, v_before, v_fresh);
    CALL {prefix}semaphore_mark_v1(p_id, v_fresh, p_ear, v_ears);
    COMMIT;
    CALL {prefix}semaphore_ring_v1(v_ears);
    SELECT v_fresh;
END
$$;

-- Supersede signals (on_lock_conflict="supersede"): one row per key and state that listens for
-- them (a holder, or a waiter about to hold), naming the connection of the state's supersede ear,
-- a session that waits in GET_LOCK(). "token" is the fencing token last signalled for the key,
-- "fresh" set until the ear has read it. A row outlives a crashed state until its lease (a day)
-- passes; purge_expired deletes it after.
CREATE TABLE IF NOT EXISTS {prefix}supersede_ears (
    id          BINARY(32) NOT NULL,                 -- SHA-256 of the prefixed lock key
    conn        BIGINT NOT NULL,                     -- CONNECTION_ID() of the state's ear
    token       BIGINT NOT NULL,                     -- the last token signalled (0: none)
    fresh       TINYINT NOT NULL,                    -- 1 until the ear read "token"
    expires_at  DATETIME(3) NOT NULL,                -- end of the row's lease
    PRIMARY KEY (id, conn),
    KEY by_conn (conn, fresh)
) ENGINE = InnoDB;

-- supersede_v1: signal the holder of key p_id under p_token: if the key is held under that token,
-- mark the token fresh in every row of the key (each listening state's ear) and, committed, wake
-- each of those ears that waits by killing its query (as inbox_wake_one_v2; a refused kill, or an
-- ear between two queries, is made up for by the ear's next query, which looks first).
CREATE PROCEDURE IF NOT EXISTS {prefix}supersede_v1(IN p_id BINARY(32), IN p_token BIGINT)
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_conn BIGINT;
    DECLARE v_done INT DEFAULT 0;
    DECLARE c_ears CURSOR FOR
        SELECT conn FROM {prefix}supersede_ears WHERE id = p_id AND expires_at > UTC_TIMESTAMP(3);
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = 1;
    IF EXISTS (SELECT 1 FROM {prefix}locks
               WHERE id = p_id AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(3)
                 AND token = p_token) THEN
        UPDATE {prefix}supersede_ears SET token = p_token, fresh = 1
        WHERE id = p_id AND token < p_token;
        OPEN c_ears;
        ears: LOOP
            FETCH c_ears INTO v_conn;
            IF v_done = 1 THEN
                LEAVE ears;
            END IF;
            BEGIN
                DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
                IF EXISTS (SELECT 1 FROM information_schema.PROCESSLIST
                           WHERE ID = v_conn AND INFO LIKE '%asynclock-supersede-ear%') THEN
                    KILL QUERY v_conn;
                END IF;
            END;
        END LOOP;
        CLOSE c_ears;
    END IF;
END
$$;

-- Supersede hand-overs (on_lock_conflict="supersede"): the events an interrupted holder left
-- for its key's next call when the newer event arrived in another process, a JSON array of
-- encoded events, oldest first. The call that collects them deletes the row; a row nobody
-- collected counts as absent once expires_at passed, and purge_expired deletes it.
CREATE TABLE IF NOT EXISTS {prefix}supersede_carried (
    id          BINARY(32) NOT NULL PRIMARY KEY,     -- SHA-256 of the prefixed lock key
    events      LONGTEXT CHARACTER SET utf8mb4 NOT NULL,  -- ["<encoded event>", ...]
    expires_at  DATETIME(3) NOT NULL,
    KEY by_expiry (expires_at)
) ENGINE = InnoDB;

-- supersede_collect_v1: take the events left for key p_id (NULL when none, or expired) and
-- delete its row, in one transaction under the row's lock. Answers one row: the JSON array.
CREATE PROCEDURE IF NOT EXISTS {prefix}supersede_collect_v1(IN p_id BINARY(32))
SQL SECURITY INVOKER
$$
BEGIN
    DECLARE v_events LONGTEXT CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
    START TRANSACTION;
    SELECT MAX(IF(expires_at > UTC_TIMESTAMP(3), events, NULL)) INTO v_events
    FROM {prefix}supersede_carried WHERE id = p_id FOR UPDATE;
    DELETE FROM {prefix}supersede_carried WHERE id = p_id;
    COMMIT;
    SELECT v_events;
END
$$;
