-- Named statements of MySQLState (loaded by asynclock/state/_sql.py), for MySQL 8 and MariaDB
-- 10.6+. {prefix} is the table prefix; %(name)s placeholders are filled by PyMySQL. Each runs
-- alone in autocommit mode, so each is one transaction; UTC_TIMESTAMP(3) is constant within a
-- statement and comes from the server's clock. Durations arrive as whole milliseconds (*_ms).
--
-- How an answer comes back in the same round trip: MySQL has no RETURNING (MariaDB has), so the
-- statements leave it in LAST_INSERT_ID(expr), which the server reports in the OK packet
-- (cursor.lastrowid) whatever the client flags. Within INSERT ... ON DUPLICATE KEY UPDATE and
-- UPDATE, assignments run left to right and later ones see earlier results: so the first
-- assignment decides, on the row's old values, and stores the decision with LAST_INSERT_ID(x);
-- the later assignments read it back with LAST_INSERT_ID() instead of re-deciding on columns
-- that were already changed. Fencing tokens are max(last token + 1, server clock in µs), so a
-- token is at least 10^15 (any date after 2001) and any smaller answer is not a token.

-- acquire --
-- Take the key for owner when it is free, expired, or reserved for this caller's state (waiter);
-- repeat the token for the current holder (idempotent); else answer the remaining milliseconds
-- and, for a waiting caller, flag the key so the holder's state gives way at release. An owner
-- whose attempt was abandoned (a mark in the row) never gets it. lastrowid >= 10^15 is the token;
-- below that it is the holder's remaining milliseconds. Atomic: INSERT ... ON DUPLICATE KEY
-- UPDATE locks the row (or inserts it) and decides on its latest committed version; an attempt
-- that changes nothing (a failed try) writes no redo log.
INSERT INTO {prefix}locks (id, name, owner, flag, token, expires_at, abandoned, abandoned_until)
VALUES (UNHEX(%(id)s), %(name)s, %(owner)s, NULL,
        LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))),
        UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND, '', '1970-01-01 00:00:00')
ON DUPLICATE KEY UPDATE
    token = CASE
        WHEN abandoned_until > UTC_TIMESTAMP(3) AND LOCATE(%(mark)s, abandoned) > 0
            THEN token + 0 * LAST_INSERT_ID(LEAST(%(ttl_ms)s, 999999999999999))
        WHEN owner <=> %(owner)s AND expires_at > UTC_TIMESTAMP(3)
            THEN LAST_INSERT_ID(token)
        WHEN expires_at <= UTC_TIMESTAMP(3)
             OR (owner IS NULL AND (flag IS NULL OR flag <=> %(waiter)s))
            THEN LAST_INSERT_ID(GREATEST(token + 1,
                 TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))))
        -- busy: the holder's remaining time; reserved for another state, which takes it
        -- without a wake-up for anyone: at most 20 ms, to be served next rather than sleep out
        -- the reservation
        ELSE token + 0 * LAST_INSERT_ID(LEAST(GREATEST(
                 TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), expires_at) DIV 1000, 0),
                 IF(owner IS NULL, 20, 999999999999999)))
    END,
    flag = CASE
        WHEN LAST_INSERT_ID() >= 1000000000000000
            THEN IF(owner <=> %(owner)s AND expires_at > UTC_TIMESTAMP(3), flag, NULL)
        WHEN %(waiter)s IS NOT NULL AND flag IS NULL AND owner IS NOT NULL
             AND expires_at > UTC_TIMESTAMP(3)
             AND NOT (abandoned_until > UTC_TIMESTAMP(3) AND LOCATE(%(mark)s, abandoned) > 0)
            THEN %(waiter)s
        ELSE flag
    END,
    expires_at = IF(LAST_INSERT_ID() >= 1000000000000000
                    AND NOT (owner <=> %(owner)s AND expires_at > UTC_TIMESTAMP(3)),
                    UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND, expires_at),
    owner = IF(LAST_INSERT_ID() >= 1000000000000000, %(owner)s, owner)

-- release --
-- Compare-and-release: only when owner holds the key (live); rowcount 0 means it did not (the
-- connection sets CLIENT_FOUND_ROWS, so rowcount counts matched rows). With a successor (not
-- abandoned) and no flag, hand the lock straight over: successor, token + 1 (lastrowid), its
-- TTL. Otherwise free it (lastrowid 0), or reserve it for reservation_ms when a waiting state
-- flagged it (lastrowid 1 then: another state waits, so this one holds the key's wake name the
-- next time it takes it). Atomic: one UPDATE under the row's lock, with the owner and expiry in
-- its WHERE.
UPDATE {prefix}locks SET
    token = IF(%(successor)s IS NOT NULL AND flag IS NULL
               AND NOT (abandoned_until > UTC_TIMESTAMP(3)
                        AND LOCATE(%(successor_mark)s, abandoned) > 0),
               LAST_INSERT_ID(token + 1), token + 0 * LAST_INSERT_ID(flag IS NOT NULL)),
    owner = IF(LAST_INSERT_ID() > 1, %(successor)s, NULL),
    expires_at = CASE
        WHEN LAST_INSERT_ID() > 1
            THEN UTC_TIMESTAMP(3) + INTERVAL %(successor_ttl_ms)s * 1000 MICROSECOND
        WHEN flag IS NULL THEN UTC_TIMESTAMP(3)
        ELSE UTC_TIMESTAMP(3) + INTERVAL %(reservation_ms)s * 1000 MICROSECOND
    END
WHERE id = UNHEX(%(id)s) AND owner = %(owner)s AND expires_at > UTC_TIMESTAMP(3)

-- abandon --
-- Undo an acquire of unknown outcome, and stop waiting: release the key if owner holds it (as
-- release does, without handoff); otherwise add owner's mark to the row (creating it if needed),
-- so that the acquire, should it still arrive, is refused until abandoned_until. Either way,
-- withdraw this state's waiting flag (waiter): a key reserved for it is freed at once, and one
-- it holds is released without a reservation for itself. Marks are kept to the last 8 KB (older
-- owners are long gone). lastrowid is the decision, taken on the row's old values: bit 1 owner
-- held the key, bit 2 the flag was ours, bit 4 the key was freed (released, or our reservation
-- withdrawn). Atomic: one INSERT ... ON DUPLICATE KEY UPDATE on the key's row, the row acquire
-- itself must lock to win; expires_at is assigned before owner and flag change.
INSERT INTO {prefix}locks (id, name, owner, flag, token, expires_at, abandoned, abandoned_until)
VALUES (UNHEX(%(id)s), %(name)s, NULL, NULL, 0 * LAST_INSERT_ID(0), UTC_TIMESTAMP(3), %(mark)s,
        UTC_TIMESTAMP(3) + INTERVAL %(mark_ttl_ms)s * 1000 MICROSECOND)
ON DUPLICATE KEY UPDATE
    token = token + 0 * LAST_INSERT_ID(
        IF(owner <=> %(owner)s AND expires_at > UTC_TIMESTAMP(3), 1 + 4, 0)
        + IF(flag <=> %(waiter)s, 2, 0)
        + IF(flag <=> %(waiter)s AND owner IS NULL AND expires_at > UTC_TIMESTAMP(3), 4, 0)),
    expires_at = CASE
        WHEN (LAST_INSERT_ID() & 3) = 1 AND flag IS NOT NULL
            THEN UTC_TIMESTAMP(3) + INTERVAL %(reservation_ms)s * 1000 MICROSECOND
        WHEN (LAST_INSERT_ID() & 1) = 1 THEN UTC_TIMESTAMP(3)
        WHEN (LAST_INSERT_ID() & 2) = 2 AND owner IS NULL
            THEN LEAST(expires_at, UTC_TIMESTAMP(3))
        ELSE expires_at
    END,
    owner = IF((LAST_INSERT_ID() & 1) = 1, NULL, owner),
    flag = IF((LAST_INSERT_ID() & 2) = 2, NULL, flag),
    abandoned = CASE
        WHEN (LAST_INSERT_ID() & 1) = 1 THEN abandoned
        WHEN abandoned_until > UTC_TIMESTAMP(3) THEN CONCAT(RIGHT(abandoned, 8192), %(mark)s)
        ELSE %(mark)s
    END,
    abandoned_until = IF((LAST_INSERT_ID() & 1) = 1, abandoned_until,
                         UTC_TIMESTAMP(3) + INTERVAL %(mark_ttl_ms)s * 1000 MICROSECOND)

-- extend --
-- Compare-then-reset the TTL: only while owner holds the key (live); a lost lock is never
-- re-created. rowcount (matched rows, CLIENT_FOUND_ROWS) 1 means done. One UPDATE.
UPDATE {prefix}locks SET expires_at = UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND
WHERE id = UNHEX(%(id)s) AND owner = %(owner)s AND expires_at > UTC_TIMESTAMP(3)

-- inspect --
-- The live holder of the key: owner, remaining microseconds, token. One read.
SELECT owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), expires_at), token
FROM {prefix}locks
WHERE id = UNHEX(%(id)s) AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(3)

-- dedupe_add --
-- Record the key unless a live record exists; lastrowid > 0 means "claimed". Atomic: INSERT ...
-- ON DUPLICATE KEY UPDATE under the row's lock; an expired record is taken over (claims + 1),
-- a live one is left as it is (no change, no redo log write).
INSERT INTO {prefix}dedupe (id, name, expires_at, claims)
VALUES (UNHEX(%(id)s), %(name)s, UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND,
        LAST_INSERT_ID(1))
ON DUPLICATE KEY UPDATE
    claims = IF(expires_at <= UTC_TIMESTAMP(3), LAST_INSERT_ID(claims + 1),
                claims + 0 * LAST_INSERT_ID(0)),
    expires_at = IF(LAST_INSERT_ID() > 0,
                    UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND, expires_at)

-- dedupe_remaining --
-- The live record's microseconds left (an expired one counts as absent). One read.
SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), expires_at)
FROM {prefix}dedupe
WHERE id = UNHEX(%(id)s) AND expires_at > UTC_TIMESTAMP(3)

-- dedupe_forget --
-- Delete the record if it is live (rowcount 1); an expired one is left to the purge. One DELETE.
DELETE FROM {prefix}dedupe WHERE id = UNHEX(%(id)s) AND expires_at > UTC_TIMESTAMP(3)

-- purge_locks --
-- Delete up to "batch" lock rows free (or expired) for longer than retention_ms and without live
-- abandon marks.
DELETE FROM {prefix}locks
WHERE expires_at < UTC_TIMESTAMP(3) - INTERVAL %(retention_ms)s * 1000 MICROSECOND
  AND abandoned_until < UTC_TIMESTAMP(3)
LIMIT %(batch)s

-- purge_dedupe --
-- Delete up to "batch" expired dedupe records.
DELETE FROM {prefix}dedupe WHERE expires_at <= UTC_TIMESTAMP(3) LIMIT %(batch)s

-- held_locks --
-- Operators' listing: every live holder whose prefixed key (name) matches the LIKE pattern, by
-- name, with the remaining microseconds. One read; a lock taken or released meanwhile may or may
-- not appear.
SELECT name, owner, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), expires_at), token
FROM {prefix}locks
WHERE name LIKE %(pattern)s ESCAPE '!' AND owner IS NOT NULL AND expires_at > UTC_TIMESTAMP(3)
ORDER BY name

-- dedupe_keep --
-- Set the record's expiry to ttl_ms from now, creating it if it is gone (a claim whose work is
-- done, or whose lease is renewed). Atomic: one INSERT ... ON DUPLICATE KEY UPDATE.
INSERT INTO {prefix}dedupe (id, name, expires_at, claims)
VALUES (UNHEX(%(id)s), %(name)s, UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND, 1)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)

-- inbox_accept --
-- Append payload to the key's inbox unless its claim is recorded ("duplicate") or max_pending
-- entries are pending ("full"); record the claim for claim_ttl_ms and mark the key as having
-- work; then, committed, unless the key's lock is held or the key waits for a retry or is parked,
-- wake one live worker, the key written into its row (the hand-out's hint). Answers one row (status, pending). Atomic: one CALL of
-- inbox_accept_v4 (schema.sql), whose append is one transaction that first locks the key's
-- inboxes row, so concurrent accepts and drain steps of one key run one after the other.
CALL {prefix}inbox_accept_v4(UNHEX(%(id)s), %(name)s, UNHEX(%(space)s), %(payload)s,
                             UNHEX(%(claim)s), %(claim_name)s, %(claim_ttl_ms)s, %(max_pending)s)

-- inbox_claim --
-- The hand-out's take: as owner, take one key of the prefix with pending entries and a free lock,
-- neither parked nor waiting for a retry not due yet, nor promised to another live worker (the
-- hint in its row), for ttl_ms, with its head handed out when "take": hint's first, then the hint
-- in worker's row (the key it was woken for, consumed). Answers one row (status, name, token,
-- entry, attempts, payload, age, pending, more). Atomic: one CALL of inbox_claim_v4 (schema.sql),
-- one transaction that passes over every row another one holds (SKIP LOCKED).
CALL {prefix}inbox_claim_v4(UNHEX(%(space)s), %(owner)s, %(ttl_ms)s, %(take)s, UNHEX(%(hint)s),
                            %(worker)s)

-- inbox_worker_seen --
-- A serving worker of the prefix is alive until lease_ms from now; its ear is connection
-- "channel" (its CONNECTION_ID()).
INSERT INTO {prefix}inbox_workers (id, space, conn, expires_at)
VALUES (%(worker)s, UNHEX(%(space)s), %(channel)s,
        UTC_TIMESTAMP(3) + INTERVAL %(lease_ms)s * 1000 MICROSECOND)
ON DUPLICATE KEY UPDATE space = VALUES(space), conn = VALUES(conn),
                        expires_at = VALUES(expires_at)

-- inbox_worker_gone --
-- A worker stops serving: no accept wakes it any more; a key it was woken for and had not claimed
-- yet is handed to another worker. One CALL of inbox_worker_gone_v1 (schema.sql).
CALL {prefix}inbox_worker_gone_v1(%(worker)s)

-- inbox_ear --
-- What a worker's ear waits in: at once 0 when the worker's row holds a hint (a key it was woken
-- for: a kill that came between two of these costs nothing), else up to "wait" seconds for the
-- lock "anchor" (held by the state's anchor, _ear.py), which the accept that wakes this worker
-- interrupts (KILL QUERY: GET_LOCK answers NULL, 1 here); 0 after the whole wait; 2 when it took
-- the lock (the anchor is gone), given back at once. Keys with work that no wake-up named are not
-- its business: they go to the worker they were handed to, or to a rescan. The marker lets
-- inbox_wake_one_v2 kill only a waiting ear.
SELECT 'asynclock-inbox-ear', IF(EXISTS (
    SELECT 1 FROM {prefix}inbox_workers WHERE id = %(worker)s AND hint IS NOT NULL
), 0, CASE GET_LOCK(%(anchor)s, %(wait)s)
    WHEN 0 THEN 0 WHEN 1 THEN 1 + RELEASE_LOCK(%(anchor)s) ELSE 1 END)

-- inbox_ear_moved --
-- A worker's ear opened again under a new connection id: the worker's row names it from now, on
-- the ear's own connection before its first inbox_ear (no row yet: inbox_worker_seen makes it).
UPDATE {prefix}inbox_workers SET conn = CONNECTION_ID() WHERE id = %(worker)s

-- inbox_step --
-- As owner, holder of the key's lock: finish entry "done" (deleted, or a dead letter with the
-- error text "dead"), then hand out the head (attempts + 1 when "take"), or release the lock when
-- nothing is pending (as release does). With retry_ms, "done" stays the head (attempts
-- unchanged), due retry_ms from now, and the lock is released; with park (and "dead"), the key is
-- parked and the lock released. Answers one row (status, entry, attempts, payload, age, pending);
-- status 'not_owner' changed nothing. Atomic: one CALL of inbox_step_v3 (schema.sql), which locks
-- the lock row, then the inboxes row, in one transaction.
CALL {prefix}inbox_step_v3(UNHEX(%(id)s), %(owner)s, %(done)s, %(dead)s, %(take)s,
                           %(retry_ms)s, %(park)s, %(reservation_ms)s)

-- inbox_requeue --
-- Put the key's dead letters back at the head of its inbox, in their order, with fresh attempt
-- counts, and unpark the key; then, committed, if it has work and nobody holds it, wake one live
-- worker. Answers one row: how many. Atomic: one CALL of inbox_requeue_v4 (schema.sql), under the
-- key's inboxes row lock.
CALL {prefix}inbox_requeue_v4(UNHEX(%(id)s), UNHEX(%(space)s))

-- inbox_discard --
-- Delete the key's dead letters and unpark it; then, committed, if it has work and nobody holds
-- it, wake one live worker. Answers one row: how many were deleted. Atomic: one CALL of
-- inbox_discard_v2 (schema.sql), under the key's inboxes row lock.
CALL {prefix}inbox_discard_v2(UNHEX(%(id)s), UNHEX(%(space)s))

-- inbox_ready --
-- The prefix's keys with pending entries, longest waiting first, except those whose lock is held
-- now (their holder drains them; a rescan would only fail to take them), those parked and those
-- whose retry is not due yet. One indexed read: what an idle worker costs per poll.
SELECT i.name
FROM {prefix}inboxes AS i
WHERE i.space = UNHEX(%(space)s) AND i.ready_at IS NOT NULL
  AND NOT i.parked AND (i.retry_at IS NULL OR i.retry_at <= UTC_TIMESTAMP(3))
  AND NOT EXISTS (SELECT 1 FROM {prefix}locks AS l
                  WHERE l.id = i.id AND l.owner IS NOT NULL AND l.expires_at > UTC_TIMESTAMP(3))
ORDER BY i.ready_at

-- inbox_keys --
-- Operators' listing: the prefix's keys with pending entries, dead letters, a retry waiting or
-- parked, by name, with the age in seconds of the head (the oldest pending entry), the seconds
-- until the waiting retry is due (NULL: none waits; 0 once due) and whether it is parked. One read.
SELECT i.name, i.pending,
       COALESCE((SELECT TIMESTAMPDIFF(MICROSECOND, e.accepted_at, UTC_TIMESTAMP(3))
                 FROM {prefix}inbox_entries AS e
                 WHERE e.inbox = i.id AND e.error IS NULL ORDER BY e.id LIMIT 1), 0) / 1000000,
       i.dead,
       IF(i.retry_at IS NULL, NULL,
          GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), i.retry_at), 0) / 1000000),
       i.parked
FROM {prefix}inboxes AS i
WHERE i.space = UNHEX(%(space)s)
  AND (i.pending > 0 OR i.dead > 0 OR i.parked OR i.retry_at IS NOT NULL)
ORDER BY i.name

-- inbox_dead_letters --
-- The key's dead letters in id (accept) order: id, attempts, error, payload. One read.
SELECT e.id, e.attempts, e.error, e.payload
FROM {prefix}inbox_entries AS e
WHERE e.inbox = UNHEX(%(id)s) AND e.error IS NOT NULL
ORDER BY e.id

-- inbox_take --
-- The batch form of inbox_step: as owner, holder of the key's lock, finish the entries "done"
-- lists (comma-separated ids: deleted, or dead letters with the error text "dead"), then hand out
-- the oldest "limit" pending entries (attempts + 1), or release the lock when nothing is pending
-- (as inbox_step does). Answers a status row ('not_owner' changed nothing, 'released', or
-- 'pending' with the seconds since the newest pending entry was accepted, and how many are
-- pending), then one 'entry' row per entry handed out (entry, attempts, payload, age, pending).
-- With retry_ms the "done" entries stay pending and the key waits; with park (and "dead") they
-- are dead letters and the key is parked; either way the lock is released, as inbox_step does.
-- Atomic: one call of inbox_take_v3 (schema.sql), which locks the lock row, then the inboxes row,
-- in one transaction.
CALL {prefix}inbox_take_v3(UNHEX(%(id)s), %(owner)s, %(done)s, %(dead)s, %(limit)s,
                           %(retry_ms)s, %(park)s, %(reservation_ms)s)

-- ==== Semaphores (SemaphoreState; procedures in schema.sql) ====================================

-- semaphore_acquire --
-- Take a permit for owner if one is free in turn, else (hold_ms > 0) keep a place in the key's
-- queue. Answers one row (token, retry_after). Atomic: one CALL of semaphore_acquire_v1, one
-- transaction that first locks the key's semaphores row.
CALL {prefix}semaphore_acquire_v2(UNHEX(%(id)s), %(name)s, %(owner)s, %(limit)s, %(ttl_ms)s,
                                  %(hold_ms)s, %(ear)s)

-- semaphore_release --
-- Give back owner's permit. Answers one row (owned, the waiters it made eligible, one per line:
-- MySQLState wakes its own; the others' ears are interrupted, all but "ear", this state's).
-- Atomic: one CALL of semaphore_release_v2, under the key's semaphores row lock.
CALL {prefix}semaphore_release_v2(UNHEX(%(id)s), %(owner)s, %(ear)s)

-- semaphore_abandon --
-- Give back owner's permit, leave the queue, mark owner given up. Answers one row: the waiters
-- this made eligible, one per line (their ears interrupted, as release does). Atomic: one CALL
-- of semaphore_abandon_v2.
CALL {prefix}semaphore_abandon_v2(UNHEX(%(id)s), %(name)s, %(owner)s, %(mark_ms)s, %(ear)s)

-- semaphore_extend --
-- Compare-then-reset the TTL of owner's live permit; a lost one is never re-created; rowcount 0
-- means it held none. Atomic: one UPDATE with the owner and expiry in its WHERE.
UPDATE {prefix}semaphore_holders
SET expires_at = UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND
WHERE semaphore = UNHEX(%(id)s) AND owner = %(owner)s AND expires_at > UTC_TIMESTAMP(3)

-- semaphore_inspect --
-- The places kept in the key's queue (a first row with owner NULL), then the live permits:
-- owner, seconds left, token. One read.
SELECT NULL, NULL, NULL, COUNT(*)
FROM {prefix}semaphore_waiters
WHERE semaphore = UNHEX(%(id)s) AND gone = 0 AND until > UTC_TIMESTAMP(3)
UNION ALL
SELECT owner, GREATEST(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(3), expires_at), 0) / 1e6,
       token, NULL
FROM {prefix}semaphore_holders
WHERE semaphore = UNHEX(%(id)s) AND expires_at > UTC_TIMESTAMP(3)

-- purge_semaphores --
-- Delete up to "batch" semaphore rows unused for longer than retention_ms with no permit and no
-- place left (purge_semaphore_holders and purge_semaphore_waiters run first); answer how many.
-- A row used meanwhile has a newer touched_at under its row lock, and is kept.
DELETE FROM {prefix}semaphores
WHERE touched_at < UTC_TIMESTAMP(3) - INTERVAL %(retention_ms)s * 1000 MICROSECOND
  AND NOT EXISTS (SELECT 1 FROM {prefix}semaphore_holders AS h
                  WHERE h.semaphore = {prefix}semaphores.id)
  AND NOT EXISTS (SELECT 1 FROM {prefix}semaphore_waiters AS w
                  WHERE w.semaphore = {prefix}semaphores.id)
LIMIT %(batch)s

-- purge_semaphore_holders --
-- Delete up to "batch" permits expired for longer than retention_ms; answer how many.
DELETE FROM {prefix}semaphore_holders
WHERE expires_at < UTC_TIMESTAMP(3) - INTERVAL %(retention_ms)s * 1000 MICROSECOND
LIMIT %(batch)s

-- purge_semaphore_ears --
-- Delete up to "batch" ear rows of places gone for longer than retention_ms; answer how many.
DELETE FROM {prefix}semaphore_ears
WHERE until < UTC_TIMESTAMP(3) - INTERVAL %(retention_ms)s * 1000 MICROSECOND
LIMIT %(batch)s

-- semaphore_ear --
-- What the semaphore waiters' ear of a state waits in: at once 1 when a release marked one of
-- its waiters (a kill missed between two of these costs nothing), else up to "wait" seconds for
-- the lock "anchor" (held by the state's anchor, _ear.py), which such a release interrupts
-- (KILL QUERY: GET_LOCK answers NULL, 1 here); 0 after the whole wait; 2 when it took the lock
-- (the anchor is gone), given back at once. The marker lets ear_kill_v1 kill only a waiting ear.
SELECT 'asynclock-semaphore-ear', IF(EXISTS (
    SELECT 1 FROM {prefix}semaphore_ears WHERE conn = CONNECTION_ID() AND woken = 1
), 1, CASE GET_LOCK(%(anchor)s, %(wait)s)
    WHEN 0 THEN 0 WHEN 1 THEN 1 + RELEASE_LOCK(%(anchor)s) ELSE 1 END)

-- semaphore_heard --
-- What the ear collects once interrupted: its marked waiters, "<key id hex>:<owner>" one per
-- line, unmarked. Atomic: one CALL of semaphore_heard_v1 (reads and deletes in one transaction).
CALL {prefix}semaphore_heard_v1()

-- purge_semaphore_waiters --
-- Delete up to "batch" places and marks expired for longer than retention_ms; answer how many.
DELETE FROM {prefix}semaphore_waiters
WHERE until < UTC_TIMESTAMP(3) - INTERVAL %(retention_ms)s * 1000 MICROSECOND
LIMIT %(batch)s

-- supersede --
-- Signal the holder of the key under token (on_lock_conflict="supersede"). One CALL of
-- supersede_v1 (schema.sql): nothing when the key is free or held under another token.
CALL {prefix}supersede_v1(UNHEX(%(id)s), %(token)s)

-- supersede_listen --
-- This state's ear (connection "conn") listens for the key's supersede signals until lease_ms
-- from now; a signal sent before this row existed is not re-read (fresh 0, token kept).
INSERT INTO {prefix}supersede_ears (id, conn, token, fresh, expires_at)
VALUES (UNHEX(%(id)s), %(conn)s, 0, 0, UTC_TIMESTAMP(3) + INTERVAL %(lease_ms)s * 1000 MICROSECOND)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at)

-- supersede_unlisten --
-- The state stops listening for the key's supersede signals.
DELETE FROM {prefix}supersede_ears WHERE id = UNHEX(%(id)s) AND conn = %(conn)s

-- supersede_heard --
-- The ear's read: the keys (id in hex) and tokens signalled to it since its last read, marked
-- read in the same statement's transaction is not possible in MySQL: see supersede_read.
SELECT HEX(id), token FROM {prefix}supersede_ears WHERE conn = %(conn)s AND fresh = 1

-- supersede_read --
-- Mark one signal read (only that token: a newer one stays fresh).
UPDATE {prefix}supersede_ears SET fresh = 0
WHERE id = UNHEX(%(id)s) AND conn = %(conn)s AND token = %(token)s

-- supersede_ear --
-- What the ear waits in: at once 0 when a signal for it is unread, else up to "wait" seconds for
-- the lock "anchor" (held by the state's anchor, _ear.py), which a signal's KILL QUERY
-- interrupts (GET_LOCK answers NULL, 0 here); 1 after the whole wait; 2 when it took the lock
-- (the anchor is gone), given back at once. The marker lets supersede_v1 kill only a waiting ear.
SELECT 'asynclock-supersede-ear', IF(EXISTS (
    SELECT 1 FROM {prefix}supersede_ears WHERE conn = CONNECTION_ID() AND fresh = 1
), 0, CASE GET_LOCK(%(anchor)s, %(wait)s)
    WHEN 0 THEN 1 WHEN 1 THEN 1 + RELEASE_LOCK(%(anchor)s) ELSE 0 END)

-- purge_supersede_ears --
-- Delete up to "batch" supersede_ears rows whose lease passed (left by a state that crashed).
DELETE FROM {prefix}supersede_ears WHERE expires_at <= UTC_TIMESTAMP(3) LIMIT %(batch)s

-- supersede_carry --
-- Leave the events (a JSON array of encoded events, oldest first) for the key's next call:
-- appended after those left before and still live (the first assignment reads the old expiry);
-- the row expires ttl_ms from now. One statement.
INSERT INTO {prefix}supersede_carried (id, events, expires_at)
VALUES (UNHEX(%(id)s), %(events)s, UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND)
ON DUPLICATE KEY UPDATE
    events = IF(expires_at > UTC_TIMESTAMP(3), JSON_MERGE_PRESERVE(events, %(events)s),
                %(events)s),
    expires_at = UTC_TIMESTAMP(3) + INTERVAL %(ttl_ms)s * 1000 MICROSECOND

-- supersede_collect --
-- Take the events left for the key's next call and delete them. Answers one row: the JSON
-- array, or NULL. One CALL of supersede_collect_v1 (schema.sql).
CALL {prefix}supersede_collect_v1(UNHEX(%(id)s))

-- purge_supersede_carried --
-- Delete up to "batch" hand-overs nobody collected before they expired.
DELETE FROM {prefix}supersede_carried WHERE expires_at <= UTC_TIMESTAMP(3) LIMIT %(batch)s
