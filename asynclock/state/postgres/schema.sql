-- PostgreSQL schema of PostgresState. {prefix} is the table_prefix option ("asynclock_").
-- Every statement is idempotent; PostgresState runs them on first use (create_schema=True),
-- inside one transaction that holds a transaction-level advisory lock, so processes starting
-- together do not race on the catalog. With create_schema=False, run this file in a migration.
-- Routine names carry a version (_v1, _v2, ...): a release that changes a body adds the next
-- version rather than altering what running processes call. This file creates only the versions
-- this release calls; those of earlier releases stay in a database where they were made (and an
-- older worker's own script makes what it calls), so both releases share the tables during a
-- rolling upgrade. Older versions can be dropped once no older worker runs.

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
    expires_at  timestamptz NOT NULL,
    owner       text                                 -- who claimed it (acquire_claimed), or NULL
);

-- A dedupe table made before the owner column existed gets it here. Looked up first,
-- through the same name resolution as the statements (regclass: search_path, case folding):
-- ALTER TABLE takes an ACCESS EXCLUSIVE lock on the table even when the column exists.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{prefix}dedupe'::regclass
                   AND attname = 'owner' AND NOT attisdropped) THEN
        ALTER TABLE {prefix}dedupe ADD COLUMN owner text;
    END IF;
END $$;

-- The durable inbox (EventDispatcher.accept / serve). One row per key with work or dead
-- letters: its counters, and the row every inbox change of the key locks first, so accepts and
-- drain steps of one key run one after the other (max_pending and release-if-empty rely on it).
-- A key's row is deleted when its last entry is gone (its next ids then start at 1 again).
CREATE TABLE IF NOT EXISTS {prefix}inboxes (
    id          bytea PRIMARY KEY,                   -- SHA-256 of the prefixed key (as locks.id)
    name        text NOT NULL,                       -- the prefixed key itself
    space       bytea NOT NULL,                      -- SHA-256 of the state's key prefix
    last_id     bigint NOT NULL,                     -- the last entry id given out
    pending     integer NOT NULL,                    -- entries not done and not dead
    dead        integer NOT NULL,                    -- dead letters
    ready_at    timestamptz                          -- since when it has pending entries
) WITH (fillfactor = 70);

-- inbox_ready (the keys of one prefix with pending entries, oldest first) and inbox_keys
CREATE INDEX IF NOT EXISTS {prefix}inboxes_space ON {prefix}inboxes (space, ready_at);

-- The entries: pending (error NULL) in id order, which is accept order; dead letters keep
-- their id and carry their last error.
CREATE TABLE IF NOT EXISTS {prefix}inbox_entries (
    inbox       bytea NOT NULL,                      -- inboxes.id
    id          bigint NOT NULL,
    attempts    integer NOT NULL,                    -- deliveries so far
    accepted_at timestamptz NOT NULL,
    payload     text NOT NULL,
    error       text,                                -- set: a dead letter
    PRIMARY KEY (inbox, id)
);

-- inbox_append: dedupe check, max_pending check and append, atomically. The first statement
-- locks the key's inboxes row (creating it); every later statement runs on a fresh snapshot (READ
-- COMMITTED, a VOLATILE function), so it sees every accept and step of the key that committed
-- before. The claim is recorded with an upsert that only takes over an expired record, so two
-- accepts of one event id never both succeed, even across keys; a record taken over loses its
-- owner, so the late forget_claimed of the dispatch whose claim lapsed cannot delete it. The start
-- of every inbox_accept_v*, which then wake whom they wake.
CREATE OR REPLACE FUNCTION {prefix}inbox_append_v1(
    p_id bytea, p_name text, p_space bytea, p_payload text, p_claim bytea, p_claim_name text,
    p_claim_ttl_ms bigint, p_max_pending integer
) RETURNS TABLE (status text, pending integer) LANGUAGE plpgsql AS $$
DECLARE
    v_pending integer;
    v_id bigint;
BEGIN
    INSERT INTO {prefix}inboxes AS i (id, name, space, last_id, pending, dead)
    VALUES (p_id, p_name, p_space, 0, 0, 0)
    ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name
    RETURNING i.pending INTO v_pending;
    IF p_claim IS NOT NULL AND EXISTS (
        SELECT 1 FROM {prefix}dedupe d WHERE d.id = p_claim AND d.expires_at > now()
    ) THEN
        RETURN QUERY SELECT 'duplicate'::text, v_pending;
        RETURN;
    END IF;
    IF v_pending >= p_max_pending THEN
        RETURN QUERY SELECT 'full'::text, v_pending;
        RETURN;
    END IF;
    IF p_claim IS NOT NULL THEN
        INSERT INTO {prefix}dedupe AS d (id, name, expires_at)
        VALUES (p_claim, p_claim_name, now() + p_claim_ttl_ms * interval '1 millisecond')
        ON CONFLICT (id) DO UPDATE SET (expires_at, owner) = (EXCLUDED.expires_at, NULL)
            WHERE d.expires_at <= now();
        IF NOT FOUND THEN  -- recorded meanwhile by a dispatch, or an accept of another key
            RETURN QUERY SELECT 'duplicate'::text, v_pending;
            RETURN;
        END IF;
    END IF;
    UPDATE {prefix}inboxes AS i
    SET last_id = i.last_id + 1, pending = i.pending + 1, ready_at = coalesce(i.ready_at, now())
    WHERE i.id = p_id
    RETURNING i.last_id, i.pending INTO v_id, v_pending;
    INSERT INTO {prefix}inbox_entries (inbox, id, attempts, accepted_at, payload)
    VALUES (p_id, v_id, 0, now(), p_payload);
    RETURN QUERY SELECT 'accepted'::text, v_pending;
END
$$;

-- inbox_requeue_rows: put the key's dead letters back at the head of its inbox, in id (accept)
-- order, with fresh attempt counts. Locks the key's inboxes row first, as accept and step do, so
-- the counters stay exact. Answers how many were put back. The start of every inbox_requeue_v*.
CREATE OR REPLACE FUNCTION {prefix}inbox_requeue_rows_v1(p_id bytea)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_moved integer;
BEGIN
    PERFORM 1 FROM {prefix}inboxes AS i WHERE i.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    UPDATE {prefix}inbox_entries AS e SET error = NULL, attempts = 0, accepted_at = now()
    WHERE e.inbox = p_id AND e.error IS NOT NULL;
    GET DIAGNOSTICS v_moved = ROW_COUNT;
    IF v_moved > 0 THEN
        UPDATE {prefix}inboxes AS i
        SET pending = i.pending + v_moved, dead = 0, ready_at = coalesce(i.ready_at, now())
        WHERE i.id = p_id;
    END IF;
    RETURN v_moved;
END
$$;

-- The inbox's hand-out (EventDispatcher.serve): a key with work and no holder goes to ONE worker.
-- Each serving worker has a row here, kept alive by its lease, and LISTENs on a channel of its
-- own; an accept that finds its key free NOTIFYs one live worker, chosen at random, which then
-- takes the key (inbox_claim). Rows of workers gone without saying so expire with their lease.
CREATE TABLE IF NOT EXISTS {prefix}inbox_workers (
    id          text PRIMARY KEY,                    -- the worker's id ("<host>:<pid>:<random>")
    space       bytea NOT NULL,                      -- SHA-256 of the state's key prefix
    channel     text NOT NULL,                       -- the channel it LISTENs on
    expires_at  timestamptz NOT NULL                 -- end of its lease
);
CREATE INDEX IF NOT EXISTS {prefix}inbox_workers_space ON {prefix}inbox_workers (space, expires_at);

-- When the last worker was woken for a key that is still free: an accept wakes nobody else for it
-- within p_wake_gap_ms (a burst of accepts for one free key costs one wake-up). Looked up first,
-- like dedupe.owner above, as ALTER TABLE locks the table even when the column exists.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{prefix}inboxes'::regclass
                   AND attname = 'woken_at' AND NOT attisdropped) THEN
        ALTER TABLE {prefix}inboxes ADD COLUMN woken_at timestamptz;
    END IF;
END $$;

-- ==== Inbox retries that wait, and parked keys (SPEC 9) ========================================
-- retry_at: the key's head waits for a retry until then (set by a step or take with retry_in, the
-- lock released in the same transaction); NULL when no retry waits; kept once due until the key is
-- taken again. parked: the key stopped at a dead letter (on_poison="park") until an operator
-- requeues or discards it. A key that waits (retry_at in the future) or is parked is not handed
-- out by accepts, not listed by inbox_ready and not taken; accepts still append behind it. Both
-- columns live on the key's inboxes row, so they survive every crash and are changed under its row
-- lock like the counters. Looked up first, as ALTER TABLE locks the table even when they exist.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{prefix}inboxes'::regclass
                   AND attname = 'retry_at' AND NOT attisdropped) THEN
        ALTER TABLE {prefix}inboxes ADD COLUMN retry_at timestamptz,
                                    ADD COLUMN parked boolean NOT NULL DEFAULT false;
    END IF;
END $$;

-- inbox_lock_rows_v2: the start of inbox_step and inbox_take. Locks the key's lock row if p_owner
-- holds the lock, then (only then) its inboxes row: always in that order, so two steps never
-- deadlock, and no accept can commit between a step's "empty" decision and its release (an
-- accept after it finds the key free). Answers o_held (false: nothing was locked), the inbox's
-- counters (NULL: the key has no inboxes row), and whether a retry waits (or is due and not
-- taken yet), read under the same row lock.
CREATE OR REPLACE FUNCTION {prefix}inbox_lock_rows_v2(
    p_id bytea, p_owner text, OUT o_held boolean, OUT o_pending integer, OUT o_dead integer,
    OUT o_retrying boolean
) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {prefix}locks AS l
    WHERE l.id = p_id AND l.owner = p_owner AND l.expires_at > now()
    FOR UPDATE;
    o_held := FOUND;
    IF o_held THEN
        SELECT i.pending, i.dead, i.retry_at IS NOT NULL INTO o_pending, o_dead, o_retrying
        FROM {prefix}inboxes AS i WHERE i.id = p_id FOR UPDATE;
    END IF;
END
$$;

-- ==== Quiet releases (#24) ======================================================================
-- A NOTIFY costs every LISTENing session of the database a transaction of its own (PostgreSQL
-- signals each of them, whatever channel it listens on, and each reads the queue), so a step that
-- NOTIFYed at every release cost one transaction per serving worker per event. The release of a
-- drained key now NOTIFYs only when a waiter of some state flagged the key, as the release
-- statement does; a state wakes its own watchers in process (unflagged releases).

-- inbox_release_v3: the end of inbox_step and inbox_take, under the rows inbox_lock_rows locked,
-- for a key that may keep pending entries (a retry waits, or it is parked): the inboxes row goes
-- only when nothing is pending and no dead letter is left, is marked idle when nothing is
-- pending, and else stays as it is. The lock is released as the release statement does: reserved
-- for p_reservation_ms when a waiter flagged it, else free, with the NOTIFY on p_channel only when
-- the key is flagged. (No v2 was ever released.)
CREATE OR REPLACE FUNCTION {prefix}inbox_release_v3(
    p_id bytea, p_pending integer, p_dead integer, p_reservation_ms bigint, p_channel text,
    p_payload text
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_flagged boolean;
BEGIN
    IF coalesce(p_pending, 0) > 0 THEN
        NULL;  -- entries stay behind a waiting retry or a parked key
    ELSIF p_dead = 0 THEN
        DELETE FROM {prefix}inboxes AS i WHERE i.id = p_id;
    ELSIF p_dead IS NOT NULL THEN
        UPDATE {prefix}inboxes AS i SET ready_at = NULL, retry_at = NULL WHERE i.id = p_id;
    END IF;
    UPDATE {prefix}locks AS l
    SET owner = NULL,
        expires_at = CASE WHEN l.flag IS NULL THEN now()
                          ELSE now() + p_reservation_ms * interval '1 millisecond' END
    WHERE l.id = p_id
    RETURNING l.flag IS NOT NULL INTO v_flagged;
    IF v_flagged THEN
        PERFORM pg_notify(p_channel, p_payload);
    END IF;
END
$$;

-- inbox_step_v4: as the lock's owner, finish the head (done: delete it; with dead: make it a dead
-- letter) and hand out the next entry (attempts + 1 unless only looked at), or, when none is
-- pending, release the lock (inbox_release_v3, quiet) in the same transaction. Starts with
-- inbox_lock_rows_v2 (the lock row, then the inboxes row). With p_retry_ms (and p_done, the
-- head): the head stays pending with its attempt count, the key's retry is due p_retry_ms from
-- now (server clock), and the lock is released. With p_park (and p_done, p_dead): the head
-- becomes a dead letter, the key is parked, and the lock is released. Otherwise the holder's step
-- hands out the head whatever the key's state (the claim that gave it the lock decided that), and
-- ends a retry's wait (retry_at cleared). Answers one row: status 'not_owner' (nothing changed),
-- 'entry' (id, attempts, payload, age in seconds, pending entries) or 'released'. (No v3 was
-- ever released.)
CREATE OR REPLACE FUNCTION {prefix}inbox_step_v4(
    p_id bytea, p_owner text, p_done bigint, p_dead text, p_take boolean, p_retry_ms bigint,
    p_park boolean, p_reservation_ms bigint, p_channel text, p_payload text
) RETURNS TABLE (
    status text, entry bigint, attempts integer, payload text, age float8, pending integer
) LANGUAGE plpgsql AS $$
DECLARE
    v_held boolean;
    v_pending integer;
    v_dead integer;
    v_closed boolean := false;
    v_retrying boolean;
    v_head {prefix}inbox_entries%ROWTYPE;
BEGIN
    SELECT r.o_held, r.o_pending, r.o_dead, r.o_retrying
    INTO v_held, v_pending, v_dead, v_retrying
    FROM {prefix}inbox_lock_rows_v2(p_id, p_owner) AS r;
    IF NOT v_held THEN
        RETURN QUERY SELECT 'not_owner'::text, NULL::bigint, NULL::integer, NULL::text,
                            NULL::float8, NULL::integer;
        RETURN;
    END IF;
    IF v_pending IS NOT NULL AND p_done IS NOT NULL AND p_retry_ms IS NOT NULL THEN
        -- the head stays where it is, attempts unchanged; the key waits, no lock held
        UPDATE {prefix}inboxes AS i
        SET retry_at = now() + p_retry_ms * interval '1 millisecond' WHERE i.id = p_id;
        v_closed := true;
    ELSIF v_pending IS NOT NULL AND p_done IS NOT NULL THEN
        -- the head, unless dead letters were requeued in front of it meanwhile
        IF p_dead IS NULL THEN
            DELETE FROM {prefix}inbox_entries AS e
            WHERE e.inbox = p_id AND e.id = p_done AND e.error IS NULL;
        ELSE
            UPDATE {prefix}inbox_entries AS e SET error = p_dead
            WHERE e.inbox = p_id AND e.id = p_done AND e.error IS NULL;
        END IF;
        IF FOUND THEN
            v_pending := v_pending - 1;
            v_dead := v_dead + CASE WHEN p_dead IS NULL THEN 0 ELSE 1 END;
            UPDATE {prefix}inboxes AS i SET pending = v_pending, dead = v_dead
            WHERE i.id = p_id;
        END IF;
        IF p_park AND p_dead IS NOT NULL THEN
            UPDATE {prefix}inboxes AS i SET parked = true, retry_at = NULL WHERE i.id = p_id;
            v_closed := true;
        END IF;
    END IF;
    IF coalesce(v_pending, 0) > 0 AND NOT v_closed THEN
        SELECT * INTO STRICT v_head FROM {prefix}inbox_entries AS e
        WHERE e.inbox = p_id AND e.error IS NULL ORDER BY e.id LIMIT 1;
        IF p_take THEN
            UPDATE {prefix}inbox_entries AS e SET attempts = e.attempts + 1
            WHERE e.inbox = p_id AND e.id = v_head.id;
            v_head.attempts := v_head.attempts + 1;
        END IF;
        IF v_retrying THEN  -- its holder hands the head out: no retry waits any more
            UPDATE {prefix}inboxes AS i SET retry_at = NULL WHERE i.id = p_id;
        END IF;
        RETURN QUERY SELECT 'entry'::text, v_head.id, v_head.attempts, v_head.payload,
                            greatest(extract(epoch FROM now() - v_head.accepted_at), 0)::float8,
                            v_pending;
        RETURN;
    END IF;
    PERFORM {prefix}inbox_release_v3(p_id, v_pending, v_dead, p_reservation_ms, p_channel,
                                     p_payload);
    RETURN QUERY SELECT 'released'::text, NULL::bigint, NULL::integer, NULL::text,
                        NULL::float8, NULL::integer;
END
$$;

-- inbox_take_v4: the batch form of inbox_step. As the lock's owner, finish the pending entries whose
-- ids p_done lists (comma-separated; deleted, or dead letters with the error p_dead, wherever
-- they are in the inbox), then hand out the oldest p_limit pending entries (attempts + 1; ending a
-- retry's wait), or, when none is pending, release the lock as inbox_step does, in the same
-- transaction (lock row, then inboxes row: no deadlock, no accept stranded). With p_retry_ms the
-- entries p_done lists stay pending with their attempt counts and the key's retry is due
-- p_retry_ms from now; with p_park (and p_dead) they become dead letters and the key is parked;
-- either way the lock is released ('released'). Answers status 'not_owner' (one row, nothing
-- changed), 'released' (one row), or 'pending' (pending entries, and as age the seconds since the
-- newest one was accepted) followed by one 'entry' row per entry handed out (id, attempts,
-- payload, age in seconds, pending), in no set order. The release is quiet (inbox_release_v3).
-- (No v3 was ever released.)
CREATE OR REPLACE FUNCTION {prefix}inbox_take_v4(
    p_id bytea, p_owner text, p_done text, p_dead text, p_limit integer, p_retry_ms bigint,
    p_park boolean, p_reservation_ms bigint, p_channel text, p_payload text
) RETURNS TABLE (
    status text, entry bigint, attempts integer, payload text, age float8, pending integer
) LANGUAGE plpgsql AS $$
DECLARE
    v_held boolean;
    v_pending integer;
    v_dead integer;
    v_closed boolean := false;
    v_retrying boolean;
    v_gone integer;
    v_done bigint[] := string_to_array(nullif(p_done, ''), ',')::bigint[];
BEGIN
    SELECT r.o_held, r.o_pending, r.o_dead, r.o_retrying
    INTO v_held, v_pending, v_dead, v_retrying
    FROM {prefix}inbox_lock_rows_v2(p_id, p_owner) AS r;
    IF NOT v_held THEN
        RETURN QUERY SELECT 'not_owner'::text, NULL::bigint, NULL::integer, NULL::text,
                            NULL::float8, NULL::integer;
        RETURN;
    END IF;
    IF v_pending IS NOT NULL AND coalesce(cardinality(v_done), 0) > 0
       AND p_retry_ms IS NOT NULL THEN
        UPDATE {prefix}inboxes AS i
        SET retry_at = now() + p_retry_ms * interval '1 millisecond' WHERE i.id = p_id;
        v_closed := true;
    ELSIF v_pending IS NOT NULL AND coalesce(cardinality(v_done), 0) > 0 THEN
        IF p_dead IS NULL THEN
            DELETE FROM {prefix}inbox_entries AS e
            WHERE e.inbox = p_id AND e.id = ANY (v_done) AND e.error IS NULL;
        ELSE
            UPDATE {prefix}inbox_entries AS e SET error = p_dead
            WHERE e.inbox = p_id AND e.id = ANY (v_done) AND e.error IS NULL;
        END IF;
        GET DIAGNOSTICS v_gone = ROW_COUNT;
        IF v_gone > 0 THEN
            v_pending := v_pending - v_gone;
            v_dead := v_dead + CASE WHEN p_dead IS NULL THEN 0 ELSE v_gone END;
            UPDATE {prefix}inboxes AS i SET pending = v_pending, dead = v_dead
            WHERE i.id = p_id;
        END IF;
        IF p_park AND p_dead IS NOT NULL THEN
            UPDATE {prefix}inboxes AS i SET parked = true, retry_at = NULL WHERE i.id = p_id;
            v_closed := true;
        END IF;
    END IF;
    IF coalesce(v_pending, 0) > 0 AND NOT v_closed THEN
        IF v_retrying AND p_limit > 0 THEN  -- its holder hands entries out: no retry waits
            UPDATE {prefix}inboxes AS i SET retry_at = NULL WHERE i.id = p_id;
        END IF;
        RETURN QUERY
        SELECT 'pending'::text, NULL::bigint, NULL::integer, NULL::text,
               greatest(extract(epoch FROM now() - n.accepted_at), 0)::float8, v_pending
        FROM (SELECT e.accepted_at FROM {prefix}inbox_entries AS e
              WHERE e.inbox = p_id AND e.error IS NULL ORDER BY e.id DESC LIMIT 1) AS n;
        RETURN QUERY
        UPDATE {prefix}inbox_entries AS e SET attempts = e.attempts + 1
        FROM (SELECT h.id FROM {prefix}inbox_entries AS h
              WHERE h.inbox = p_id AND h.error IS NULL ORDER BY h.id LIMIT p_limit) AS t
        WHERE e.inbox = p_id AND e.id = t.id
        RETURNING 'entry'::text, e.id, e.attempts, e.payload,
                  greatest(extract(epoch FROM now() - e.accepted_at), 0)::float8, v_pending;
        RETURN;
    END IF;
    PERFORM {prefix}inbox_release_v3(p_id, v_pending, v_dead, p_reservation_ms, p_channel,
                                     p_payload);
    RETURN QUERY SELECT 'released'::text, NULL::bigint, NULL::integer, NULL::text,
                        NULL::float8, NULL::integer;
END
$$;

-- inbox_open: whether key p_id may be handed out now as far as its inbox goes: not parked, and no
-- retry waiting that is not due yet (a key without an inboxes row counts as open).
CREATE OR REPLACE FUNCTION {prefix}inbox_open_v1(p_id bytea)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (SELECT 1 FROM {prefix}inboxes AS i
                       WHERE i.id = p_id AND (i.parked OR i.retry_at > now()))
$$;

-- ==== The inbox hand-out's ear (#24): a wake-up that reaches one worker without a NOTIFY ========
-- On PostgreSQL up to 18 at least, every commit that NOTIFYs signals every LISTENing session of
-- the database, whatever its channel, and each reads the queue in a transaction of its own: a
-- NOTIFY per event costs a transaction per worker process. So each serving worker also keeps an
-- ear: a session of its own waiting in inbox_ear_v1 (pg_sleep), its pid in its inbox_workers row;
-- the waker writes the key into the worker's row (hint) and cancels the ear's sleep
-- (pg_cancel_backend), in the accept's transaction. A cancel acts at once, before that commit,
-- and a cancel that lands between two of the ear's statements is dropped by the server; so:
-- * the hint stays locked (the waker's row lock) until the accept commits, and whoever reads it
--   (the ear's check, the worker's claim) locks the row first, WITHOUT skip locked: it waits for
--   that commit (microseconds) and then sees the hint;
-- * the ear checks its row for a hint before each sleep, so a cancel dropped between two
--   statements is made up for by the next one.
-- pg_cancel_backend needs the ear's role (or pg_signal_backend), and the waker must see the ear's
-- query in pg_stat_activity (the same role, or pg_read_all_stats); otherwise, or if the worker has
-- no ear (an older client), the waker NOTIFYs the worker's channel instead.
DO $$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{prefix}inbox_workers'::regclass
                   AND attname = 'ear' AND NOT attisdropped) THEN
        ALTER TABLE {prefix}inbox_workers ADD COLUMN ear integer;  -- the ear's backend pid
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{prefix}inbox_workers'::regclass
                   AND attname = 'hint' AND NOT attisdropped) THEN
        ALTER TABLE {prefix}inbox_workers ADD COLUMN hint bytea;  -- a key woken for, unclaimed
    END IF;
END $$;

-- inbox_wake_one_v2: the hand-out's wake-up, at the end of an accept or a requeue that left the
-- key's lock free: unless a worker was woken for the key less than p_wake_gap_ms ago, pick one
-- live worker of the space at random, preferring one whose row no other transaction holds (a
-- concurrent wake-up or the worker's own claim), lock its row, write the key as its hint, and
-- cancel its ear's sleep if the pid is an ear of this database that the caller may cancel; else
-- NOTIFY the worker's channel (the key's id in hex as the payload). The ear is recognised by its
-- statement (the column name "asynclock-inbox-ear"): a pid recorded by a worker gone without
-- saying so may name another session by now, which is never cancelled. A worker gone without
-- its lease having run out misses the wake-up; a rescan finds the key.
CREATE OR REPLACE FUNCTION {prefix}inbox_wake_one_v2(
    p_id bytea, p_space bytea, p_wake_gap_ms bigint
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_worker {prefix}inbox_workers%ROWTYPE;
    v_cancelled boolean := false;
BEGIN
    UPDATE {prefix}inboxes AS i SET woken_at = now()
    WHERE i.id = p_id
      AND (i.woken_at IS NULL OR i.woken_at <= now() - p_wake_gap_ms * interval '1 millisecond');
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT * INTO v_worker FROM {prefix}inbox_workers AS w
    WHERE w.space = p_space AND w.expires_at > now()
    ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- every live worker's row is held: wait for one (its holder commits in microseconds); a
        -- wake-up must not be dropped, the woken worker could claim before this key commits
        SELECT * INTO v_worker FROM {prefix}inbox_workers AS w
        WHERE w.space = p_space AND w.expires_at > now()
        ORDER BY random() LIMIT 1 FOR UPDATE;
        IF NOT FOUND THEN
            RETURN;  -- no live worker: a rescan takes the key
        END IF;
    END IF;
    IF v_worker.ear IS NOT NULL THEN
        UPDATE {prefix}inbox_workers AS w SET hint = p_id WHERE w.id = v_worker.id;
        IF EXISTS (SELECT 1 FROM pg_stat_get_activity(v_worker.ear) AS a
                   WHERE a.datid = (SELECT d.oid FROM pg_database AS d
                                    WHERE d.datname = current_database())
                     AND a.query LIKE 'SELECT %AS "asynclock-inbox-ear"') THEN
            BEGIN
                v_cancelled := pg_cancel_backend(v_worker.ear);
            EXCEPTION WHEN insufficient_privilege THEN
                v_cancelled := false;
            END;
        END IF;
    END IF;
    IF NOT v_cancelled THEN
        PERFORM pg_notify(v_worker.channel, encode(p_id, 'hex'));
    END IF;
END
$$;

-- inbox_accept_v6: inbox_append_v1, then, if the entry was accepted and the key is free and open
-- (neither waiting for its retry nor parked: a worker woken for it could not take it), wake one
-- worker through its ear (inbox_wake_one_v2). Answers (status, pending).
CREATE OR REPLACE FUNCTION {prefix}inbox_accept_v6(
    p_id bytea, p_name text, p_space bytea, p_payload text, p_claim bytea, p_claim_name text,
    p_claim_ttl_ms bigint, p_max_pending integer, p_wake_gap_ms bigint
) RETURNS TABLE (status text, pending integer) LANGUAGE plpgsql AS $$
DECLARE
    v_status text;
    v_pending integer;
BEGIN
    SELECT a.status, a.pending INTO v_status, v_pending
    FROM {prefix}inbox_append_v1(p_id, p_name, p_space, p_payload, p_claim, p_claim_name,
                                 p_claim_ttl_ms, p_max_pending) AS a;
    IF v_status = 'accepted' AND NOT EXISTS (
        SELECT 1 FROM {prefix}locks l
        WHERE l.id = p_id AND l.owner IS NOT NULL AND l.expires_at > now()
    ) AND {prefix}inbox_open_v1(p_id) THEN
        PERFORM {prefix}inbox_wake_one_v2(p_id, p_space, p_wake_gap_ms);
    END IF;
    RETURN QUERY SELECT v_status, v_pending;
END
$$;

-- inbox_hand_out_v2: the end of a requeue or a discard that may have opened the key: if entries
-- are pending, the key is open and nobody holds its lock, wake one worker for it at once (no gap)
-- through its ear (inbox_wake_one_v2).
CREATE OR REPLACE FUNCTION {prefix}inbox_hand_out_v2(p_id bytea, p_space bytea)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {prefix}inboxes AS i WHERE i.id = p_id AND i.pending > 0)
       AND {prefix}inbox_open_v1(p_id) AND NOT EXISTS (
        SELECT 1 FROM {prefix}locks l
        WHERE l.id = p_id AND l.owner IS NOT NULL AND l.expires_at > now()
    ) THEN
        UPDATE {prefix}inboxes AS i SET woken_at = NULL WHERE i.id = p_id;
        PERFORM {prefix}inbox_wake_one_v2(p_id, p_space, 0);
    END IF;
END
$$;

-- inbox_requeue_v4: the key's dead letters back at its head (attempts from 0, so the next delivery
-- is attempt 1), the key unparked (a retry that waits still holds it until due); then, if the key
-- has work, is open and free, the hand-out's wake-up (inbox_hand_out_v2). Answers how many were
-- put back.
CREATE OR REPLACE FUNCTION {prefix}inbox_requeue_v4(
    p_id bytea, p_space bytea
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_moved integer;
BEGIN
    v_moved := {prefix}inbox_requeue_rows_v1(p_id);  -- locks the inboxes row first
    UPDATE {prefix}inboxes AS i SET parked = false WHERE i.id = p_id AND i.parked;
    PERFORM {prefix}inbox_hand_out_v2(p_id, p_space);
    RETURN v_moved;
END
$$;

-- inbox_discard_v2: delete the key's dead letters and unpark it, under its inboxes row lock (taken
-- first, as every inbox change does); the row goes when nothing is left. Then, if entries are
-- pending, the key is open and free, the hand-out's wake-up (inbox_hand_out_v2). Answers how
-- many were deleted.
CREATE OR REPLACE FUNCTION {prefix}inbox_discard_v2(
    p_id bytea, p_space bytea
) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_pending integer;
    v_gone integer;
BEGIN
    SELECT i.pending INTO v_pending FROM {prefix}inboxes AS i WHERE i.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    DELETE FROM {prefix}inbox_entries AS e WHERE e.inbox = p_id AND e.error IS NOT NULL;
    GET DIAGNOSTICS v_gone = ROW_COUNT;
    IF v_pending = 0 THEN
        DELETE FROM {prefix}inboxes AS i WHERE i.id = p_id;
        RETURN v_gone;
    END IF;
    UPDATE {prefix}inboxes AS i SET dead = 0, parked = false WHERE i.id = p_id;
    PERFORM {prefix}inbox_hand_out_v2(p_id, p_space);
    RETURN v_gone;
END
$$;

-- inbox_promised_v1: whether key p_id is the hint of another live worker of the space than
-- p_worker: a key an accept woke that worker for, not claimed yet. Another worker's claim passes
-- over it, so a worker that claims again ("more") does not take the key the woken one is about to
-- claim (its claim would find nothing: one wasted transaction per such event). The woken worker
-- takes it with its hint; a rescan's take names it (p_hint) and so takes it even from a worker
-- gone without saying so.
CREATE OR REPLACE FUNCTION {prefix}inbox_promised_v1(p_id bytea, p_space bytea, p_worker text)
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {prefix}inbox_workers AS w
                   WHERE w.space = p_space AND w.hint = p_id AND w.id <> p_worker
                     AND w.expires_at > now())
$$;

-- inbox_claim_v4: the hand-out's take, for worker p_worker. Its hint first: the row read locked,
-- without skip locked, so a wake-up still in flight (its accept not committed: the ear's cancel
-- came first) is waited for; the hint is consumed, and its key comes first (after p_hint, if
-- given). Then as p_owner, take one key of the space that has pending entries, whose lock is
-- free, that is neither parked nor waiting for a retry not due yet, nor promised to another live
-- worker (inbox_promised_v1), the longest waiting first, for p_ttl_ms: its lock, the next fencing
-- token, and with p_take its head entry handed out (attempts + 1); a retry it takes no longer
-- waits. Never waits for a key's row: the lock row, then the inboxes row (the order of
-- inbox_step and inbox_take), each FOR UPDATE SKIP LOCKED, so a key another transaction is
-- changing is passed over, and two claims never take one key; the key's state is checked again
-- under the inboxes row lock. Answers one row: status 'none' (nothing to take) or 'taken' (the
-- key's prefixed name, its token, and with p_take the entry: id, attempts, payload, age in
-- seconds, pending), and "more": whether another free key with work, promised to nobody else,
-- waits (the worker claims again at once).
CREATE OR REPLACE FUNCTION {prefix}inbox_claim_v4(
    p_space bytea, p_owner text, p_ttl_ms bigint, p_take boolean, p_hint bytea, p_worker text
) RETURNS TABLE (
    status text, name text, token bigint, entry bigint, attempts integer, payload text,
    age float8, pending integer, more boolean
) LANGUAGE plpgsql AS $$
DECLARE
    v_id bytea;
    v_lock {prefix}locks%ROWTYPE;
    v_name text;
    v_pending integer;
    v_closed boolean;
    v_token bigint;
    v_seen integer := 0;
    v_head {prefix}inbox_entries%ROWTYPE;
    v_more boolean;
    v_hint bytea;
BEGIN
    -- the tables in the order every other transaction (and the schema script: CREATE INDEX IF
    -- NOT EXISTS takes a SHARE lock) takes them, inbox_workers last: no deadlock
    LOCK TABLE {prefix}locks, {prefix}inboxes, {prefix}inbox_entries IN ROW EXCLUSIVE MODE;
    SELECT w.hint INTO v_hint FROM {prefix}inbox_workers AS w WHERE w.id = p_worker FOR UPDATE;
    IF v_hint IS NOT NULL THEN
        UPDATE {prefix}inbox_workers AS w SET hint = NULL WHERE w.id = p_worker;
    END IF;
    p_hint := coalesce(p_hint, v_hint);
    FOR v_id, v_name IN
        (SELECT i.id, i.name FROM {prefix}inboxes AS i
         WHERE p_hint IS NOT NULL AND i.id = p_hint AND i.space = p_space)
        UNION ALL
        (SELECT c.id, c.name FROM (
            SELECT i.id, i.name FROM {prefix}inboxes AS i
            LEFT JOIN {prefix}locks AS l ON l.id = i.id
            WHERE i.space = p_space AND i.ready_at IS NOT NULL
              AND NOT i.parked AND (i.retry_at IS NULL OR i.retry_at <= now())
              AND (l.id IS NULL OR l.expires_at <= now() OR (l.owner IS NULL AND l.flag IS NULL))
              AND NOT {prefix}inbox_promised_v1(i.id, p_space, p_worker)
            ORDER BY i.ready_at
            LIMIT 16) AS c)
    LOOP
        v_seen := v_seen + 1;
        SELECT * INTO v_lock FROM {prefix}locks AS l WHERE l.id = v_id FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            IF NOT (v_lock.expires_at <= now() OR (v_lock.owner IS NULL AND v_lock.flag IS NULL))
            THEN
                CONTINUE;  -- held, or reserved for a waiter of another state
            END IF;
        ELSE
            IF EXISTS (SELECT 1 FROM {prefix}locks AS l WHERE l.id = v_id) THEN
                CONTINUE;  -- another transaction is changing it: pass it over
            END IF;
            INSERT INTO {prefix}locks AS l (id, name, owner, token, expires_at)
            VALUES (v_id, v_name, NULL, 0, '-infinity')
            ON CONFLICT (id) DO NOTHING;
            IF NOT FOUND THEN
                CONTINUE;
            END IF;
            SELECT * INTO v_lock FROM {prefix}locks AS l WHERE l.id = v_id;
        END IF;
        SELECT i.pending, i.parked OR coalesce(i.retry_at > now(), false)
        INTO v_pending, v_closed FROM {prefix}inboxes AS i
        WHERE i.id = v_id FOR UPDATE SKIP LOCKED;
        IF NOT FOUND OR coalesce(v_pending, 0) = 0 OR v_closed THEN
            CONTINUE;  -- being changed (an accept: it wakes a worker if need be), drained or closed
        END IF;
        v_token := greatest(v_lock.token + 1, (extract(epoch FROM now()) * 1000000)::bigint);
        UPDATE {prefix}locks AS l
        SET owner = p_owner, flag = NULL, token = v_token,
            expires_at = now() + p_ttl_ms * interval '1 millisecond'
        WHERE l.id = v_id;
        UPDATE {prefix}inboxes AS i SET woken_at = NULL, retry_at = NULL WHERE i.id = v_id;
        v_more := v_seen > 1 OR EXISTS (
            SELECT 1 FROM {prefix}inboxes AS i
            LEFT JOIN {prefix}locks AS l ON l.id = i.id
            WHERE i.space = p_space AND i.ready_at IS NOT NULL AND i.id <> v_id
              AND NOT i.parked AND (i.retry_at IS NULL OR i.retry_at <= now())
              AND (l.id IS NULL OR l.expires_at <= now() OR (l.owner IS NULL AND l.flag IS NULL))
              AND NOT {prefix}inbox_promised_v1(i.id, p_space, p_worker));
        IF p_take THEN
            SELECT * INTO STRICT v_head FROM {prefix}inbox_entries AS e
            WHERE e.inbox = v_id AND e.error IS NULL ORDER BY e.id LIMIT 1;
            UPDATE {prefix}inbox_entries AS e SET attempts = e.attempts + 1
            WHERE e.inbox = v_id AND e.id = v_head.id;
            RETURN QUERY SELECT 'taken'::text, v_name, v_token, v_head.id, v_head.attempts + 1,
                                v_head.payload,
                                greatest(extract(epoch FROM now() - v_head.accepted_at), 0)::float8,
                                v_pending, v_more;
        ELSE
            RETURN QUERY SELECT 'taken'::text, v_name, v_token, NULL::bigint, NULL::integer,
                                NULL::text, NULL::float8, v_pending, v_more;
        END IF;
        RETURN;
    END LOOP;
    RETURN QUERY SELECT 'none'::text, NULL::text, NULL::bigint, NULL::bigint, NULL::integer,
                        NULL::text, NULL::float8, NULL::integer, false;
END
$$;

-- inbox_ear_v1: the ear's wait. Fails at once with SQLSTATE ALE02 if the worker's row holds a
-- hint (an error, not an answer: the statement's transaction commits nothing, like a cancelled
-- one), read with the row locked (a wake-up in flight is waited for, as in inbox_claim_v4) in a
-- subtransaction rolled back at once, so no waker waits for the sleep; else sleeps p_wait seconds
-- (false), unless a wake-up cancels the sleep first (the statement then fails with
-- query_canceled).
CREATE OR REPLACE FUNCTION {prefix}inbox_ear_v1(p_worker text, p_wait float8)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_hint bytea;
BEGIN
    BEGIN
        SELECT w.hint INTO v_hint FROM {prefix}inbox_workers AS w
        WHERE w.id = p_worker FOR UPDATE;
        RAISE SQLSTATE 'ALE01';  -- roll the subtransaction back: its row lock goes with it
    EXCEPTION WHEN SQLSTATE 'ALE01' THEN
        NULL;
    END;
    IF v_hint IS NOT NULL THEN
        RAISE SQLSTATE 'ALE02' USING MESSAGE = 'asynclock inbox ear: a wake-up is waiting';
    END IF;
    PERFORM pg_sleep(p_wait);
    RETURN false;
END
$$;

-- inbox_worker_gone_v1: a worker stops serving: its row goes, and a hint it had not claimed yet
-- (a wake-up that reached it as it stopped) is handed to another live worker (inbox_hand_out_v2),
-- not left to the rescans. The row is deleted with it locked: a wake-up in flight is waited for.
CREATE OR REPLACE FUNCTION {prefix}inbox_worker_gone_v1(p_worker text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_hint bytea;
    v_space bytea;
BEGIN
    DELETE FROM {prefix}inbox_workers AS w WHERE w.id = p_worker
    RETURNING w.hint, w.space INTO v_hint, v_space;
    IF v_hint IS NOT NULL THEN
        PERFORM {prefix}inbox_hand_out_v2(v_hint, v_space);
    END IF;
END
$$;

-- ==== Semaphores (asynclock.Semaphore, the SemaphoreState capability) ==========================
-- Separate from the lock and inbox tables: a semaphore key is a namespace of its own. Every
-- operation on a key first locks its row of {prefix}semaphores (created on first use), so the
-- operations of one key run one after another in every process; the row keeps the last
-- fencing token and the last queue number, and stays after the key goes idle (purge_expired()
-- deletes it token_retention after its last use). Names are versioned (_v1): a changed body
-- gets the next version.
CREATE TABLE IF NOT EXISTS {prefix}semaphores (
    id          bytea PRIMARY KEY,                   -- SHA-256 of the prefixed key
    name        text NOT NULL,                       -- the prefixed key itself
    token       bigint NOT NULL,                     -- the last fencing token issued
    seq         bigint NOT NULL,                     -- the last queue number given out
    touched_at  timestamptz NOT NULL                 -- the last acquire or place (for purge)
) WITH (fillfactor = 70);

-- The permits held: one row per holder, gone when released or (lazily) expired.
CREATE TABLE IF NOT EXISTS {prefix}semaphore_holders (
    semaphore   bytea NOT NULL,                      -- semaphores.id
    owner       text NOT NULL,
    token       bigint NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (semaphore, owner)
);

-- The queue of waiters, in seq (arrival) order; a place is kept until "until". A row with
-- gone = true is an abandon mark (an acquire of that owner still on the wire must fail), not a
-- waiter; it lives until "until" as well.
CREATE TABLE IF NOT EXISTS {prefix}semaphore_waiters (
    semaphore   bytea NOT NULL,                      -- semaphores.id
    owner       text NOT NULL,
    seq         bigint NOT NULL,
    permits     integer NOT NULL,                    -- the limit it waits with
    until       timestamptz NOT NULL,
    gone        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (semaphore, owner)
);

CREATE INDEX IF NOT EXISTS {prefix}semaphore_waiters_order
    ON {prefix}semaphore_waiters (semaphore, seq);

-- semaphore_eligible: the waiters at the head of the key's queue that may take a permit with
-- p_held permits taken (each, and every one ahead of it, fits p_held + position < its limit),
-- oldest first. The walk stops at the first that does not fit. Call it under the key's row lock.
CREATE OR REPLACE FUNCTION {prefix}semaphore_eligible_v1(p_id bytea, p_held integer)
RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_position integer := 0;
BEGIN
    FOR r IN SELECT w.owner, w.permits FROM {prefix}semaphore_waiters AS w
             WHERE w.semaphore = p_id AND NOT w.gone AND w.until > now()
             ORDER BY w.seq LOOP
        EXIT WHEN p_held + v_position >= r.permits;
        RETURN NEXT r.owner;
        v_position := v_position + 1;
    END LOOP;
END
$$;

-- semaphore_wake: under the key's row lock, NOTIFY the waiters eligible now that were not in
-- p_before (payload "<p_payload>:<owner>", one each), and answer them.
CREATE OR REPLACE FUNCTION {prefix}semaphore_wake_v1(
    p_id bytea, p_before text[], p_channel text, p_payload text
) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    v_owner text;
    v_held integer;
BEGIN
    SELECT count(*) INTO v_held FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id;
    FOR v_owner IN SELECT e FROM {prefix}semaphore_eligible_v1(p_id, v_held) AS e LOOP
        IF NOT v_owner = ANY (p_before) THEN
            PERFORM pg_notify(p_channel, p_payload || ':' || v_owner);
            RETURN NEXT v_owner;
        END IF;
    END LOOP;
END
$$;

-- semaphore_acquire: take a permit for p_owner if one is free in turn (see SemaphoreState);
-- with p_hold_ms > 0, on refusal join the queue (or keep the place) for p_hold_ms. Answers one
-- row: the token, or NULL and the seconds until a permit or a place ahead expires.
CREATE OR REPLACE FUNCTION {prefix}semaphore_acquire_v1(
    p_id bytea, p_name text, p_owner text, p_limit integer, p_ttl_ms bigint, p_hold_ms bigint
) RETURNS TABLE (o_token bigint, o_retry_after float8) LANGUAGE plpgsql AS $$
DECLARE
    v_token bigint;
    v_seq bigint;
    v_mine bigint;
    v_my_seq bigint;
    v_gone boolean;
    v_held integer;
    v_position integer;
    v_fits boolean;
    v_first timestamptz;
BEGIN
    INSERT INTO {prefix}semaphores AS s (id, name, token, seq, touched_at)
    VALUES (p_id, p_name, 0, 0, now())
    ON CONFLICT (id) DO UPDATE SET touched_at = now()
    RETURNING s.token, s.seq INTO v_token, v_seq;
    DELETE FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id AND h.expires_at <= now();
    DELETE FROM {prefix}semaphore_waiters AS w WHERE w.semaphore = p_id AND w.until <= now();
    -- a repeated call that won already: the same token, its TTL reset from now
    UPDATE {prefix}semaphore_holders AS h
    SET expires_at = now() + p_ttl_ms * interval '1 millisecond'
    WHERE h.semaphore = p_id AND h.owner = p_owner
    RETURNING h.token INTO v_mine;
    IF v_mine IS NOT NULL THEN
        RETURN QUERY SELECT v_mine, NULL::float8;
        RETURN;
    END IF;
    SELECT w.gone, w.seq INTO v_gone, v_my_seq
    FROM {prefix}semaphore_waiters AS w WHERE w.semaphore = p_id AND w.owner = p_owner;
    IF v_gone THEN  -- given up (semaphore_abandon ran first): never granted, never queued
        RETURN QUERY SELECT NULL::bigint, p_ttl_ms / 1000.0::float8;
        RETURN;
    END IF;
    SELECT count(*) INTO v_held FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id;
    SELECT count(*) INTO v_position FROM {prefix}semaphore_waiters AS w
    WHERE w.semaphore = p_id AND NOT w.gone AND (v_my_seq IS NULL OR w.seq < v_my_seq);
    v_fits := v_held + v_position < p_limit;
    IF v_fits AND v_position > 0 THEN  -- everyone ahead fits too
        v_fits := (SELECT count(*) FROM {prefix}semaphore_eligible_v1(p_id, v_held)) >= v_position;
    END IF;
    IF v_fits THEN
        DELETE FROM {prefix}semaphore_waiters AS w WHERE w.semaphore = p_id AND w.owner = p_owner;
        v_token := greatest(v_token + 1, (extract(epoch FROM now()) * 1000000)::bigint);
        UPDATE {prefix}semaphores AS s SET token = v_token WHERE s.id = p_id;
        INSERT INTO {prefix}semaphore_holders (semaphore, owner, token, expires_at)
        VALUES (p_id, p_owner, v_token, now() + p_ttl_ms * interval '1 millisecond');
        RETURN QUERY SELECT v_token, NULL::float8;
        RETURN;
    END IF;
    IF p_hold_ms > 0 THEN
        IF v_my_seq IS NULL THEN
            v_seq := v_seq + 1;
            v_my_seq := v_seq;
            UPDATE {prefix}semaphores AS s SET seq = v_seq WHERE s.id = p_id;
            INSERT INTO {prefix}semaphore_waiters (semaphore, owner, seq, permits, until)
            VALUES (p_id, p_owner, v_seq, p_limit, now() + p_hold_ms * interval '1 millisecond');
        ELSE
            UPDATE {prefix}semaphore_waiters AS w
            SET until = now() + p_hold_ms * interval '1 millisecond', permits = p_limit
            WHERE w.semaphore = p_id AND w.owner = p_owner;
        END IF;
    END IF;
    SELECT least(
        (SELECT min(h.expires_at) FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id),
        (SELECT min(a.until) FROM (
            SELECT w.until FROM {prefix}semaphore_waiters AS w
            WHERE w.semaphore = p_id AND NOT w.gone AND (v_my_seq IS NULL OR w.seq < v_my_seq)
            ORDER BY w.seq LIMIT p_limit) AS a)
    ) INTO v_first;
    RETURN QUERY SELECT NULL::bigint,
        coalesce(greatest(extract(epoch FROM v_first - now()), 0), p_ttl_ms / 1000.0)::float8;
END
$$;

-- semaphore_release: give back p_owner's permit and wake the waiters that made eligible (a
-- permit that expired meanwhile counts too). Answers one row: (owned, the owners woken).
CREATE OR REPLACE FUNCTION {prefix}semaphore_release_v1(
    p_id bytea, p_owner text, p_channel text, p_payload text
) RETURNS TABLE (o_owned boolean, o_woken text[]) LANGUAGE plpgsql AS $$
DECLARE
    v_before text[];
    v_held integer;
    v_owned boolean;
BEGIN
    PERFORM 1 FROM {prefix}semaphores AS s WHERE s.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, ARRAY[]::text[];
        RETURN;
    END IF;
    SELECT count(*) INTO v_held FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id;
    v_before := ARRAY(SELECT {prefix}semaphore_eligible_v1(p_id, v_held));
    DELETE FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id AND h.owner = p_owner
    RETURNING h.expires_at > now() INTO v_owned;
    DELETE FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id AND h.expires_at <= now();
    RETURN QUERY SELECT coalesce(v_owned, false),
        ARRAY(SELECT {prefix}semaphore_wake_v1(p_id, v_before, p_channel, p_payload));
END
$$;

-- semaphore_abandon: undo an acquire of unknown outcome, or stop waiting: give back p_owner's
-- permit, take it out of the queue and leave its mark for p_mark_ms (a late acquire then fails),
-- then wake the waiters that made eligible. Answers the owners woken.
CREATE OR REPLACE FUNCTION {prefix}semaphore_abandon_v1(
    p_id bytea, p_name text, p_owner text, p_mark_ms bigint, p_channel text, p_payload text
) RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v_before text[];
    v_held integer;
BEGIN
    INSERT INTO {prefix}semaphores AS s (id, name, token, seq, touched_at)
    VALUES (p_id, p_name, 0, 0, now())
    ON CONFLICT (id) DO UPDATE SET touched_at = now();
    SELECT count(*) INTO v_held FROM {prefix}semaphore_holders AS h WHERE h.semaphore = p_id;
    v_before := ARRAY(SELECT {prefix}semaphore_eligible_v1(p_id, v_held));
    DELETE FROM {prefix}semaphore_holders AS h
    WHERE h.semaphore = p_id AND (h.owner = p_owner OR h.expires_at <= now());
    INSERT INTO {prefix}semaphore_waiters AS w (semaphore, owner, seq, permits, until, gone)
    VALUES (p_id, p_owner, 0, 0, now() + p_mark_ms * interval '1 millisecond', true)
    ON CONFLICT (semaphore, owner) DO UPDATE SET gone = true, until = EXCLUDED.until;
    RETURN ARRAY(SELECT {prefix}semaphore_wake_v1(p_id, v_before, p_channel, p_payload));
END
$$;

-- Supersede hand-overs (on_lock_conflict="supersede"): the events an interrupted holder left
-- for its key's next call when the newer event arrived in another process, a JSON array of
-- encoded events, oldest first. The call that collects them deletes the row; a row nobody
-- collected counts as absent once expires_at passed, and purge_expired deletes it.
CREATE TABLE IF NOT EXISTS {prefix}supersede_carried (
    id          bytea PRIMARY KEY,                   -- SHA-256 of the prefixed lock key
    events      jsonb NOT NULL,                      -- ["<encoded event>", ...]
    expires_at  timestamptz NOT NULL
);
