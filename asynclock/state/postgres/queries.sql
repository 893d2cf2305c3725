-- Named statements of PostgresState (loaded by asynclock/state/_sql.py). {prefix} is the table
-- prefix; %(name)s placeholders become $1, $2, ... for asyncpg. Each runs alone in autocommit
-- mode, so each is one transaction; now() is its start time on the server's clock. Durations
-- arrive as whole milliseconds (*_ms). Fencing tokens are max(last token + 1, server clock in
-- microseconds): strictly increasing per key while its row exists, and still increasing after
-- purge_expired() deleted a long-free row (the clock has moved on since).

-- acquire --
-- Take the key for owner when it is free, expired, or reserved for this caller's state (waiter);
-- repeat the token for the current holder (idempotent); else answer the remaining seconds and,
-- for a waiting caller, flag the key so the holder's state gives way at release. An owner whose
-- attempt was abandoned (a mark in the row) never gets it. Atomic: the snapshot read "cur" only
-- answers the cases that change nothing (a failed try is one read, no row lock, no WAL flush);
-- every change goes through one INSERT ... ON CONFLICT DO UPDATE, which locks the row and decides
-- on its latest committed version, never on the snapshot, so two acquirers cannot both win.
-- With claim_id (ClaimingState.acquire_claimed), the statement first records dedupe claim
-- claim_id for owner, as dedupe_add does, and touches the lock only if that claim is new ("gate");
-- a duplicate answers no row at all. Without it (NULL) the claim steps do nothing. Row lock order:
-- the claim's dedupe row, then the lock's row ("gate" is read before "up" can run), the order
-- release takes them in too (see release; docs/decisions.md, "PostgreSQL claims").
WITH claim_upd AS (
    UPDATE {prefix}dedupe
    SET expires_at = now() + %(claim_ttl_ms)s::bigint * interval '1 millisecond', owner = %(owner)s
    WHERE id = %(claim_id)s AND expires_at <= now()
    RETURNING 1
), claim_ins AS (
    INSERT INTO {prefix}dedupe (id, name, expires_at, owner)
    SELECT %(claim_id)s, %(claim_name)s,
           now() + %(claim_ttl_ms)s::bigint * interval '1 millisecond', %(owner)s
    WHERE %(claim_id)s::bytea IS NOT NULL AND NOT EXISTS (SELECT 1 FROM claim_upd)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
), gate AS (
    SELECT 1 WHERE %(claim_id)s::bytea IS NULL
    UNION ALL SELECT 1 FROM claim_upd
    UNION ALL SELECT 1 FROM claim_ins
), cur AS (
    SELECT l.token, l.expires_at,
           l.abandoned_until > now() AND strpos(l.abandoned, %(mark)s) > 0 AS gave_up,
           coalesce(l.owner = %(owner)s AND l.expires_at > now(), false) AS mine,
           l.expires_at > now() AND (l.owner IS NOT NULL OR l.flag IS NOT NULL) AS busy,
           l.flag IS NOT NULL OR %(waiter)s::text IS NULL AS nothing_to_flag,
           coalesce(l.owner IS NULL AND l.flag = %(waiter)s, false) AS reserved_for_us,
           l.owner IS NULL AS reserved
    FROM {prefix}locks AS l
    WHERE l.id = %(id)s
), answered AS (
    SELECT * FROM cur
    WHERE (gave_up OR mine OR (busy AND nothing_to_flag AND NOT reserved_for_us))
      AND EXISTS (SELECT 1 FROM gate)
), up AS (
    INSERT INTO {prefix}locks AS l (id, name, owner, token, expires_at)
    SELECT %(id)s, %(name)s, %(owner)s, (extract(epoch FROM now()) * 1000000)::bigint,
           now() + %(ttl_ms)s::bigint * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT 1 FROM answered) AND EXISTS (SELECT 1 FROM gate)
    ON CONFLICT (id) DO UPDATE SET (owner, flag, token, expires_at) = (
        SELECT CASE WHEN d.take THEN EXCLUDED.owner ELSE l.owner END,
               CASE WHEN d.take THEN NULL WHEN d.flag_it THEN %(waiter)s ELSE l.flag END,
               CASE WHEN d.take THEN greatest(l.token + 1, EXCLUDED.token) ELSE l.token END,
               CASE WHEN d.take THEN EXCLUDED.expires_at ELSE l.expires_at END
        FROM (
            SELECT
                NOT (l.abandoned_until > now() AND strpos(l.abandoned, %(mark)s) > 0)
                AND (l.expires_at <= now()
                     OR (l.owner IS NULL AND (l.flag IS NULL OR coalesce(l.flag = %(waiter)s, false))))
                AS take,
                NOT (l.abandoned_until > now() AND strpos(l.abandoned, %(mark)s) > 0)
                AND %(waiter)s::text IS NOT NULL AND l.flag IS NULL AND l.expires_at > now()
                AND coalesce(l.owner <> %(owner)s, false)
                AS flag_it
        ) AS d
    )
    RETURNING CASE WHEN l.owner = %(owner)s AND l.expires_at > now() THEN l.token END AS token,
              greatest(extract(epoch FROM l.expires_at - now()), 0)::float8 AS retry_after
)
SELECT token, CASE WHEN token IS NULL THEN retry_after END AS retry_after FROM up
UNION ALL
SELECT CASE WHEN mine AND NOT gave_up THEN token END,
       CASE WHEN gave_up THEN %(ttl_ms)s::bigint / 1000.0
            -- reserved for another state, which takes it without a NOTIFY: look again soon
            -- (flag the new holder, be served next) rather than sleep out the reservation
            WHEN NOT mine AND reserved
                THEN least(greatest(extract(epoch FROM expires_at - now()), 0), 0.02)
            WHEN NOT mine THEN greatest(extract(epoch FROM expires_at - now()), 0) END::float8
FROM answered

-- release --
-- Compare-and-release: only when owner holds the key (live). With a successor (not abandoned)
-- and no flag, hand the lock straight over: successor, token + 1, its TTL. Otherwise free it,
-- or reserve it for reservation_ms when a waiting state flagged it, and then NOTIFY the release
-- (payload: the key's id in hex) in the same transaction, so listeners hear it after commit. An
-- unflagged release sends no NOTIFY: every waiter of another state has flagged the key or left
-- it to another state's flag (whose release, or withdrawal in abandon, does NOTIFY; the waiter
-- then flags the next holder), and a NOTIFY costs every committing release a turn on one global
-- lock held through its commit's WAL flush (docs/decisions.md, "PostgreSQL claims").
-- Atomic: one UPDATE; its row lock and the re-check of the WHERE on the latest row version
-- serialise it with every other statement on the key. With claim_id (release_claimed), the same
-- statement also sets dedupe claim claim_id to expire claim_ttl_ms from now, keeping its owner
-- (created for owner if gone), whether or not the release matched. "settle" runs before the
-- UPDATE locks the lock's row (its count is in the UPDATE's WHERE, which is evaluated before a
-- row is locked): claim row first, lock row second, as in acquire. Left unreferenced, it would
-- run after the main query, lock row first: two statements taking the same two rows in opposite
-- orders deadlock.
WITH settle AS (
    INSERT INTO {prefix}dedupe AS d (id, name, expires_at, owner)
    SELECT %(claim_id)s, %(claim_name)s,
           now() + %(claim_ttl_ms)s::bigint * interval '1 millisecond', %(owner)s
    WHERE %(claim_id)s::bytea IS NOT NULL
    ON CONFLICT (id) DO UPDATE SET (expires_at, owner) = (
        EXCLUDED.expires_at, CASE WHEN d.expires_at > now() THEN d.owner ELSE EXCLUDED.owner END)
    RETURNING 1
), r AS (
    UPDATE {prefix}locks AS l SET (owner, token, expires_at) = (
        SELECT CASE WHEN d.handoff THEN %(successor)s END,
               l.token + CASE WHEN d.handoff THEN 1 ELSE 0 END,
               CASE WHEN d.handoff THEN now() + %(successor_ttl_ms)s::bigint * interval '1 millisecond'
                    WHEN l.flag IS NULL THEN now()
                    ELSE now() + %(reservation_ms)s::bigint * interval '1 millisecond' END
        FROM (
            SELECT %(successor)s::text IS NOT NULL AND l.flag IS NULL
                   AND NOT (l.abandoned_until > now()
                            AND strpos(l.abandoned, %(successor_mark)s) > 0) AS handoff
        ) AS d
    )
    WHERE l.id = %(id)s AND l.owner = %(owner)s AND l.expires_at > now()
      AND (SELECT count(*) FROM settle) >= 0
    RETURNING l.owner IS NOT NULL AS handed_over, l.token, l.flag IS NOT NULL AS flagged
)
SELECT token, handed_over,
       (CASE WHEN flagged AND NOT handed_over THEN pg_notify(%(channel)s, %(payload)s) END)
           IS NULL AS sent
FROM r

-- abandon --
-- Undo an acquire of unknown outcome, and stop waiting: release the key if owner holds it (as
-- release does, without handoff); otherwise add owner's mark to the row (creating it if needed),
-- so that the acquire, should it still arrive, is refused until abandoned_until. Either way,
-- withdraw this state's waiting flag (waiter): a key reserved for it is freed at once, and one
-- it holds is released without a reservation for itself. NOTIFY when the key was freed, or when
-- this state's flag was withdrawn (the waiters of other states that left the flag to it then
-- flag the key themselves; see release) (payload: the key's id in hex). Marks are kept to the
-- last 8 KB (older owners are long gone). Atomic: one INSERT ... ON CONFLICT DO UPDATE decides
-- on the latest version of the key's row, the row acquire itself must lock to win. The snapshot
-- read "cur" only tells a withdrawn reservation (which leaves the row free) from a row that was
-- free already, and a withdrawn flag, for the NOTIFY.
WITH cur AS (
    SELECT l.owner IS NULL AND l.flag = %(waiter)s AND l.expires_at > now() AS reserved_for_us,
           coalesce(l.flag = %(waiter)s, false) AS flagged_by_us
    FROM {prefix}locks AS l
    WHERE l.id = %(id)s
), a AS (
    INSERT INTO {prefix}locks AS l (id, name, owner, token, expires_at, abandoned, abandoned_until)
    VALUES (%(id)s, %(name)s, NULL, 0, now(), %(mark)s,
            now() + %(mark_ttl_ms)s::bigint * interval '1 millisecond')
    ON CONFLICT (id) DO UPDATE SET (owner, flag, expires_at, abandoned, abandoned_until) = (
        SELECT CASE WHEN d.held THEN NULL ELSE l.owner END,
               CASE WHEN d.ours THEN NULL ELSE l.flag END,
               CASE WHEN d.held AND l.flag IS NOT NULL AND NOT d.ours
                        THEN now() + %(reservation_ms)s::bigint * interval '1 millisecond'
                    WHEN d.held THEN now()
                    WHEN d.ours AND l.owner IS NULL THEN least(l.expires_at, now())
                    ELSE l.expires_at END,
               CASE WHEN d.held THEN l.abandoned
                    WHEN l.abandoned_until > now() THEN right(l.abandoned, 8192) || EXCLUDED.abandoned
                    ELSE EXCLUDED.abandoned END,
               CASE WHEN d.held THEN l.abandoned_until ELSE EXCLUDED.abandoned_until END
        FROM (SELECT coalesce(l.owner = %(owner)s AND l.expires_at > now(), false) AS held,
                     coalesce(l.flag = %(waiter)s, false) AS ours) AS d
    )
    RETURNING strpos(l.abandoned, %(mark)s) = 0 AS released,
              l.owner IS NULL AND l.flag IS NULL AS free
), f AS (
    SELECT a.released OR (a.free AND coalesce((SELECT reserved_for_us FROM cur), false)) AS freed,
           coalesce((SELECT flagged_by_us FROM cur), false) AS withdrew
    FROM a
)
SELECT freed,
       (CASE WHEN freed OR withdrew THEN pg_notify(%(channel)s, %(payload)s) END) IS NULL AS sent
FROM f

-- extend --
-- Compare-then-reset the TTL: only while owner holds the key (live); a lost lock is never
-- re-created. Atomic: one UPDATE with the owner and expiry in its WHERE.
UPDATE {prefix}locks SET expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond'
WHERE id = %(id)s AND owner = %(owner)s AND expires_at > now()
RETURNING token

-- inspect --
-- The live holder of the key: owner, remaining seconds, token. One read.
SELECT owner, greatest(extract(epoch FROM expires_at - now()), 0)::float8 AS remaining, token
FROM {prefix}locks
WHERE id = %(id)s AND owner IS NOT NULL AND expires_at > now()

-- dedupe_add --
-- Record the key unless a live record exists; a row returned means "claimed". Atomic: the
-- UPDATE takes over an expired record under its row lock (re-checking expiry on the latest
-- version), else the INSERT ... ON CONFLICT DO NOTHING creates it; of concurrent callers exactly
-- one succeeds. A duplicate (live record) is one read: no row lock, no WAL flush.
WITH upd AS (
    UPDATE {prefix}dedupe
    SET expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond', owner = NULL
    WHERE id = %(id)s AND expires_at <= now()
    RETURNING 1
), ins AS (
    INSERT INTO {prefix}dedupe (id, name, expires_at)
    SELECT %(id)s, %(name)s, now() + %(ttl_ms)s::bigint * interval '1 millisecond'
    WHERE NOT EXISTS (SELECT 1 FROM upd)
    ON CONFLICT (id) DO NOTHING
    RETURNING 1
)
SELECT 1 FROM upd UNION ALL SELECT 1 FROM ins

-- dedupe_remaining --
-- The live record's seconds left (an expired one counts as absent). One read.
SELECT greatest(extract(epoch FROM expires_at - now()), 0)::float8
FROM {prefix}dedupe
WHERE id = %(id)s AND expires_at > now()

-- forget_claimed --
-- Compare-and-delete: delete the live record only if owner's acquire_claimed recorded it; a row
-- returned means it did. One DELETE.
DELETE FROM {prefix}dedupe WHERE id = %(id)s AND owner = %(owner)s AND expires_at > now()
RETURNING 1

-- dedupe_forget --
-- Delete the record; a row returned means it was live (an expired one counts as absent). One
-- DELETE.
WITH d AS (DELETE FROM {prefix}dedupe WHERE id = %(id)s RETURNING expires_at > now() AS live)
SELECT 1 FROM d WHERE live

-- purge_locks --
-- Delete up to "batch" lock rows free (or expired) for longer than retention_ms and without live
-- abandon marks; answer how many. The outer WHERE repeats the test, so a row re-taken meanwhile
-- is kept.
WITH d AS (
    DELETE FROM {prefix}locks
    WHERE id IN (
        SELECT id FROM {prefix}locks
        WHERE expires_at < now() - %(retention_ms)s::bigint * interval '1 millisecond'
          AND abandoned_until < now()
        LIMIT %(batch)s
    )
    AND expires_at < now() - %(retention_ms)s::bigint * interval '1 millisecond'
    AND abandoned_until < now()
    RETURNING 1
)
SELECT count(*)::int FROM d

-- purge_dedupe --
-- Delete up to "batch" expired dedupe records (the outer WHERE re-checks expiry); answer how
-- many.
WITH d AS (
    DELETE FROM {prefix}dedupe
    WHERE id IN (SELECT id FROM {prefix}dedupe WHERE expires_at <= now() LIMIT %(batch)s)
    AND expires_at <= now()
    RETURNING 1
)
SELECT count(*)::int FROM d

-- held_locks --
-- Operators' listing: every live holder whose prefixed key (name) matches the LIKE pattern, by
-- name. One read; a lock taken or released meanwhile may or may not appear.
SELECT name, owner, greatest(extract(epoch FROM expires_at - now()), 0)::float8 AS remaining, token
FROM {prefix}locks
WHERE name LIKE %(pattern)s ESCAPE '!' AND owner IS NOT NULL AND expires_at > now()
ORDER BY name

-- dedupe_keep --
-- Set the record's expiry to ttl_ms from now, creating it if it is gone (a claim whose work is
-- done, or whose lease is renewed). Atomic: one INSERT ... ON CONFLICT DO UPDATE.
-- A live record keeps its owner (see forget_claimed); an expired one revived here has none.
INSERT INTO {prefix}dedupe AS d (id, name, expires_at)
VALUES (%(id)s, %(name)s, now() + %(ttl_ms)s::bigint * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE
SET (expires_at, owner) = (EXCLUDED.expires_at, CASE WHEN d.expires_at > now() THEN d.owner END)
RETURNING 1

-- inbox_accept --
-- Append payload to the key's inbox unless its claim is recorded ("duplicate") or max_pending
-- entries are pending ("full"); record the claim for claim_ttl_ms and mark the key as having work;
-- unless the key's lock is held (its holder's next step takes the entry), or the key waits for a
-- retry or is parked, wake one live worker of the prefix (at most one per wake_gap_ms for the
-- key; through its ear, else a NOTIFY: inbox_wake_one_v2): the hand-out. Answers (status,
-- pending). Atomic: one call of inbox_accept_v6
-- (schema.sql), one transaction that first locks the key's inboxes row, so concurrent accepts and
-- drain steps of one key run one after the other.
SELECT status, pending
FROM {prefix}inbox_accept_v6(%(id)s, %(name)s, %(space)s, %(payload)s, %(claim)s,
                             %(claim_name)s, %(claim_ttl_ms)s, %(max_pending)s, %(wake_gap_ms)s)

-- inbox_claim --
-- The hand-out's take: as owner, take one key of the prefix with pending entries and a free lock,
-- neither parked nor waiting for a retry not due yet, nor promised to another live worker (the
-- hint in its row), for ttl_ms, with its head handed out when "take": hint's first, then the hint
-- a wake-up wrote in this worker's row (consumed). Answers (status, name, token, entry, attempts,
-- payload, age, pending, more). Atomic: one call of inbox_claim_v4 (schema.sql), which waits only
-- for the worker's own row (a wake-up in flight commits in microseconds) and passes over every
-- other row another transaction holds (SKIP LOCKED).
SELECT status, name, token, entry, attempts, payload, age, pending, more
FROM {prefix}inbox_claim_v4(%(space)s, %(owner)s, %(ttl_ms)s, %(take)s, %(hint)s, %(worker)s)

-- inbox_worker_seen --
-- A serving worker of the prefix is alive until lease_ms from now, LISTENs on "channel" and
-- waits in inbox_ear on the session of pid "ear" (NULL: none now); its hint is kept.
INSERT INTO {prefix}inbox_workers AS w (id, space, channel, expires_at, ear)
VALUES (%(worker)s, %(space)s, %(channel)s, now() + %(lease_ms)s::bigint * interval '1 millisecond',
        %(ear)s)
ON CONFLICT (id) DO UPDATE SET (space, channel, expires_at, ear) =
    (EXCLUDED.space, EXCLUDED.channel, EXCLUDED.expires_at, EXCLUDED.ear)

-- inbox_ear --
-- A worker's ear waits (its own session): fails at once (SQLSTATE ALE02) if a wake-up left a hint
-- in the worker's row, else a sleep of "wait" seconds (false) that a wake-up cancels
-- (query_canceled); either way the wake-up commits no transaction of the ear's. The column
-- name marks the session as an ear for the waker (pg_stat_activity.query). One call of
-- inbox_ear_v1 (schema.sql).
SELECT {prefix}inbox_ear_v1(%(worker)s, %(wait)s) AS "asynclock-inbox-ear"

-- inbox_worker_gone --
-- A worker stops serving: no accept wakes it any more; a key it was woken for and had not claimed
-- yet is handed to another worker. One call of inbox_worker_gone_v1 (schema.sql).
SELECT {prefix}inbox_worker_gone_v1(%(worker)s)

-- inbox_step --
-- As owner, holder of the key's lock: finish entry "done" (deleted, or a dead letter with the
-- error text "dead"), then hand out the head (attempts + 1 when "take"), or release the lock when
-- nothing is pending (as release does: NOTIFY on the release channel only if a waiter flagged the
-- key). With retry_ms, "done"
-- stays the head (attempts unchanged), due retry_ms from now, and the lock is released; with park
-- (and "dead"), the key is parked and the lock released. Answers (status, entry, attempts,
-- payload, age, pending); status 'not_owner' changed nothing. Atomic: one call of inbox_step_v4
-- (schema.sql), which locks the lock row, then the inboxes row, in one transaction.
SELECT status, entry, attempts, payload, age, pending
FROM {prefix}inbox_step_v4(%(id)s, %(owner)s, %(done)s, %(dead)s, %(take)s, %(retry_ms)s,
                           %(park)s, %(reservation_ms)s, %(channel)s, %(payload)s)

-- inbox_requeue --
-- Put the key's dead letters back at the head of its inbox, in their order, with fresh attempt
-- counts, and unpark the key; if it has work and nobody holds it, wake one live worker (the
-- hand-out). Answers how many. Atomic: one call of inbox_requeue_v4 (schema.sql), under the key's
-- inboxes row lock.
SELECT {prefix}inbox_requeue_v4(%(id)s, %(space)s)

-- inbox_discard --
-- Delete the key's dead letters and unpark it; if it has work and nobody holds it, wake one
-- live worker (the hand-out). Answers how many were deleted. Atomic: one call of inbox_discard_v2
-- (schema.sql), under the key's inboxes row lock.
SELECT {prefix}inbox_discard_v2(%(id)s, %(space)s)

-- inbox_ready --
-- The prefix's keys with pending entries, longest waiting first, except those whose lock is held
-- now (their holder drains them; a rescan would only fail to take them), those parked and those
-- whose retry is not due yet. One indexed read.
SELECT i.name
FROM {prefix}inboxes AS i
WHERE i.space = %(space)s AND i.ready_at IS NOT NULL
  AND NOT i.parked AND (i.retry_at IS NULL OR i.retry_at <= now())
  AND NOT EXISTS (SELECT 1 FROM {prefix}locks AS l
                  WHERE l.id = i.id AND l.owner IS NOT NULL AND l.expires_at > now())
ORDER BY i.ready_at

-- inbox_keys --
-- Operators' listing: the prefix's keys with pending entries, dead letters, a retry waiting or
-- parked, by name, with the age in seconds of the head (the oldest pending entry), the seconds
-- until the waiting retry is due (NULL: none waits; 0 once due) and whether it is parked. One read.
SELECT i.name, i.pending,
       coalesce(extract(epoch FROM now() - (
           SELECT e.accepted_at FROM {prefix}inbox_entries AS e
           WHERE e.inbox = i.id AND e.error IS NULL ORDER BY e.id LIMIT 1)), 0)::float8,
       i.dead,
       CASE WHEN i.retry_at IS NOT NULL  -- (greatest() would make a NULL 0)
            THEN greatest(extract(epoch FROM i.retry_at - now()), 0) END::float8,
       i.parked
FROM {prefix}inboxes AS i
WHERE i.space = %(space)s AND (i.pending > 0 OR i.dead > 0 OR i.parked OR i.retry_at IS NOT NULL)
ORDER BY i.name

-- inbox_dead_letters --
-- The key's dead letters in id (accept) order: id, attempts, error, payload. One read.
SELECT e.id, e.attempts, e.error, e.payload
FROM {prefix}inbox_entries AS e
WHERE e.inbox = %(id)s AND e.error IS NOT NULL
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
-- Atomic: one call of inbox_take_v4 (schema.sql), which locks the lock row, then the inboxes row,
-- in one transaction.
SELECT status, entry, attempts, payload, age, pending
FROM {prefix}inbox_take_v4(%(id)s, %(owner)s, %(done)s, %(dead)s, %(limit)s, %(retry_ms)s,
                           %(park)s, %(reservation_ms)s, %(channel)s, %(payload)s)

-- ==== Semaphores (SemaphoreState; functions in schema.sql) =====================================

-- semaphore_acquire --
-- Take a permit for owner if one is free in turn, else (hold_ms > 0) keep a place in the key's
-- queue. Answers (token, retry_after). Atomic: one call of semaphore_acquire_v1, one
-- transaction that first locks the key's semaphores row.
SELECT o_token, o_retry_after
FROM {prefix}semaphore_acquire_v1(%(id)s, %(name)s, %(owner)s, %(limit)s, %(ttl_ms)s,
                                  %(hold_ms)s)

-- semaphore_release --
-- Give back owner's permit; NOTIFY the waiters it made eligible. Answers (owned, woken owners).
-- Atomic: one call of semaphore_release_v1, under the key's semaphores row lock.
SELECT o_owned, o_woken
FROM {prefix}semaphore_release_v1(%(id)s, %(owner)s, %(channel)s, %(payload)s)

-- semaphore_abandon --
-- Give back owner's permit, leave the queue, mark owner given up; NOTIFY the waiters this made
-- eligible. Answers the owners woken. Atomic: one call of semaphore_abandon_v1.
SELECT {prefix}semaphore_abandon_v1(%(id)s, %(name)s, %(owner)s, %(mark_ms)s, %(channel)s,
                                   %(payload)s)

-- semaphore_extend --
-- Compare-then-reset the TTL of owner's live permit; a lost one is never re-created. Atomic: one
-- UPDATE with the owner and expiry in its WHERE.
UPDATE {prefix}semaphore_holders
SET expires_at = now() + %(ttl_ms)s::bigint * interval '1 millisecond'
WHERE semaphore = %(id)s AND owner = %(owner)s AND expires_at > now()
RETURNING token

-- semaphore_inspect --
-- The places kept in the key's queue (a first row with owner NULL), then the live permits:
-- owner, seconds left, token. One read.
SELECT NULL::text, NULL::float8, NULL::bigint, count(*)::int
FROM {prefix}semaphore_waiters
WHERE semaphore = %(id)s AND NOT gone AND until > now()
UNION ALL
SELECT owner, greatest(extract(epoch FROM expires_at - now()), 0)::float8, token, NULL::int
FROM {prefix}semaphore_holders
WHERE semaphore = %(id)s AND expires_at > now()

-- purge_semaphores --
-- Delete up to "batch" permits and places expired for longer than retention_ms, and semaphore
-- rows unused for that long with no permit and no place left; answer how many rows. A row used
-- meanwhile has a newer touched_at under its row lock, and is kept.
WITH h AS (
    DELETE FROM {prefix}semaphore_holders WHERE (semaphore, owner) IN (
        SELECT semaphore, owner FROM {prefix}semaphore_holders
        WHERE expires_at < now() - %(retention_ms)s::bigint * interval '1 millisecond'
        LIMIT %(batch)s)
    RETURNING 1
), w AS (
    DELETE FROM {prefix}semaphore_waiters WHERE (semaphore, owner) IN (
        SELECT semaphore, owner FROM {prefix}semaphore_waiters
        WHERE until < now() - %(retention_ms)s::bigint * interval '1 millisecond'
        LIMIT %(batch)s)
    RETURNING 1
), s AS (
    DELETE FROM {prefix}semaphores AS s WHERE s.id IN (
        SELECT x.id FROM {prefix}semaphores AS x
        WHERE x.touched_at < now() - %(retention_ms)s::bigint * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM {prefix}semaphore_holders AS h WHERE h.semaphore = x.id
                          AND h.expires_at > now())
          AND NOT EXISTS (SELECT 1 FROM {prefix}semaphore_waiters AS w WHERE w.semaphore = x.id
                          AND w.until > now())
        LIMIT %(batch)s)
      AND s.touched_at < now() - %(retention_ms)s::bigint * interval '1 millisecond'
    RETURNING 1
)
SELECT ((SELECT count(*) FROM h) + (SELECT count(*) FROM w) + (SELECT count(*) FROM s))::int

-- supersede --
-- Signal the holder of the key if it still holds it under token (on_lock_conflict="supersede"):
-- NOTIFY on the state's supersede channel, payload "<the key's id in hex> <token>", heard by the
-- LISTEN connection of every state once this commits. One read of the lock row; nothing is sent
-- when the key is free or held under another token (a holder that has gone).
SELECT pg_notify(%(channel)s, %(payload)s)
FROM {prefix}locks
WHERE id = %(id)s AND owner IS NOT NULL AND expires_at > now() AND token = %(token)s

-- supersede_carry --
-- Leave the events (a JSON array of encoded events, oldest first) for the key's next call:
-- appended after those left before and still live; the row expires ttl_ms from now. One
-- statement (the row lock orders two carriers).
INSERT INTO {prefix}supersede_carried AS c (id, events, expires_at)
VALUES (%(id)s, %(events)s::jsonb, now() + %(ttl_ms)s::bigint * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE
SET events = CASE WHEN c.expires_at > now() THEN c.events || EXCLUDED.events
                  ELSE EXCLUDED.events END,
    expires_at = EXCLUDED.expires_at

-- supersede_collect --
-- Take the events left for the key's next call (none once expired), deleting the row: one row,
-- the JSON array as text, or no row. One statement.
WITH d AS (
    DELETE FROM {prefix}supersede_carried WHERE id = %(id)s RETURNING events, expires_at
)
SELECT events::text FROM d WHERE expires_at > now()

-- purge_supersede_carried --
-- Delete up to "batch" hand-overs nobody collected before they expired; answer how many.
WITH d AS (
    DELETE FROM {prefix}supersede_carried
    WHERE id IN (SELECT id FROM {prefix}supersede_carried WHERE expires_at <= now()
                 LIMIT %(batch)s)
    AND expires_at <= now()
    RETURNING 1
)
SELECT count(*)::int FROM d
