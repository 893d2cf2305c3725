-- Prepended to release.lua to make inbox_step: finish the head of a key's inbox and hand out the
-- next entry, or release the lock when there is none, in one atomic step fenced by the lock.
-- KEYS[3] the inbox, KEYS[4] the head's attempt count, KEYS[5] the dead letters, KEYS[6] the set of
-- keys with work, KEYS[7] the entry counter, KEYS[8] the key's hold (see _hold.lua), KEYS[9] the
-- attempt counts of entries that are not the head (a hash: entry id -> deliveries; see
-- _inbox_take.lua, and inbox_requeue.lua, which keeps the head's there when it puts dead letters
-- in front of it: the count comes back when the entry is the head again)
-- ARGV[6] the id of the entry done ('' for none), ARGV[7] '1' to dead-letter it instead,
-- ARGV[8] its error text, ARGV[9] '1' to hand out the next entry ('0': only look at it),
-- ARGV[10] the key (as the caller names it), ARGV[11] retry_ms: the head stays and the key waits
-- that long ('' for none), ARGV[12] '1' to park the key (with ARGV[7] '1')
-- returns -1 when ARGV[1] does not hold the lock (nothing changed); {entry, attempts, now ms,
-- entries pending} for the next entry (the lock kept; its attempt count incremented only when
-- handed out, which ends a retry's wait); else falls through to release.lua (0): the inbox is
-- empty, or the key now waits for a retry (the head kept with its count, the key's score in the
-- set of keys with work its due time), or is parked (taken out of that set: see _hold.lua)
if held_by(KEYS[1]) ~= ARGV[1] then
  return -1
end
if ARGV[11] ~= '' and redis.call('LLEN', KEYS[3]) > 0 then
  wait_for_retry(KEYS[8], KEYS[6], ARGV[10], tonumber(ARGV[11]))
else
  if ARGV[6] ~= '' then
    -- the entry done is the head, unless dead letters were requeued in front of it meanwhile
    local window = redis.call('LRANGE', KEYS[3], 0, 99)
    for i, entry in ipairs(window) do
      if id_of(entry) == ARGV[6] then
        redis.call('LREM', KEYS[3], 1, entry)
        if ARGV[7] == '1' then
          local attempts
          if i == 1 then
            attempts = tonumber(redis.call('GET', KEYS[4]) or '0')
          else
            attempts = tonumber(redis.call('HGET', KEYS[9], ARGV[6]) or '0')
          end
          redis.call('RPUSH', KEYS[5], cjson.encode({entry, attempts, ARGV[8]}))
        end
        redis.call('HDEL', KEYS[9], ARGV[6])
        if i == 1 then
          redis.call('DEL', KEYS[4])
          -- the next head's count, if it was kept while requeued entries went first
          local next_head = redis.call('LINDEX', KEYS[3], 0)
          if next_head then
            local kept = redis.call('HGET', KEYS[9], id_of(next_head))
            if kept then
              redis.call('SET', KEYS[4], kept)
              redis.call('HDEL', KEYS[9], id_of(next_head))
            end
          end
        end
        break
      end
    end
  end
  if ARGV[12] == '1' then
    park(KEYS[8], KEYS[6], ARGV[10])
  end
  local head = nil
  if not is_parked(KEYS[8]) then
    head = redis.call('LINDEX', KEYS[3], 0)
  end
  if head then
    local attempts
    if ARGV[9] == '1' then
      attempts = redis.call('INCR', KEYS[4])
      redis.call('DEL', KEYS[8])  -- delivered: a retry's wait is over
    else
      attempts = tonumber(redis.call('GET', KEYS[4]) or '0')
    end
    local now = redis.call('TIME')
    local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
    return {head, attempts, now_ms, redis.call('LLEN', KEYS[3])}
  end
  if redis.call('LLEN', KEYS[3]) == 0 then
    drained(KEYS[6], ARGV[10], KEYS[4], KEYS[9], KEYS[8], KEYS[5], KEYS[7])
  end
end
