-- Prepended to release.lua to make inbox_take (the batch form of _inbox_step.lua): finish a set
-- of entries of a key's inbox and hand out the oldest pending ones, or release the lock when none
-- is pending, in one atomic step fenced by the lock.
-- KEYS[3] the inbox, KEYS[4] the head's attempt count (kept for _inbox_step.lua), KEYS[5] the
-- dead letters, KEYS[6] the set of keys with work, KEYS[7] the entry counter, KEYS[8] the attempt
-- counts of entries handed out by this script (a hash: entry id -> deliveries), KEYS[9] the key's
-- hold (see _hold.lua)
-- ARGV[6] how many entries to hand out (0: none), ARGV[7] '1' to dead-letter the entries done
-- instead of removing them, ARGV[8] their error text, ARGV[9] the key (as the caller names it),
-- ARGV[10] retry_ms: the entries done stay pending and the key waits that long ('' for none),
-- ARGV[11] '1' to park the key (with ARGV[7] '1'), ARGV[12..] the ids of the entries done
-- returns -1 when ARGV[1] does not hold the lock (nothing changed); {now ms, entries pending,
-- newest entry, entry 1, attempts 1, ...} while entries are pending (the lock kept; the attempt
-- count of each entry handed out incremented; handing the head out ends a retry's wait); else
-- falls through to release.lua (0): the inbox is empty, or the key now waits for a retry (the
-- entries done kept with their counts) or is parked (see _hold.lua)
if held_by(KEYS[1]) ~= ARGV[1] then
  return -1
end
-- deliveries of entry `id` so far; the head's may have been counted by _inbox_step.lua
local function attempts_of(id, is_head)
  local count = tonumber(redis.call('HGET', KEYS[8], id) or '0')
  if is_head then
    count = math.max(count, tonumber(redis.call('GET', KEYS[4]) or '0'))
  end
  return count
end
local retry = ARGV[10] ~= '' and redis.call('LLEN', KEYS[3]) > 0
if retry then
  wait_for_retry(KEYS[9], KEYS[6], ARGV[9], tonumber(ARGV[10]))
elseif #ARGV >= 12 then
  local done, left = {}, 0
  for i = 12, #ARGV do
    done[ARGV[i]] = true
    left = left + 1
  end
  -- anywhere in the inbox: dead letters may have been requeued in front meanwhile
  for i, entry in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
    local id = id_of(entry)
    if done[id] then
      if ARGV[7] == '1' then
        redis.call('RPUSH', KEYS[5], cjson.encode({entry, attempts_of(id, i == 1), ARGV[8]}))
      end
      if i == 1 then
        redis.call('DEL', KEYS[4])
      end
      redis.call('LREM', KEYS[3], 1, entry)
      redis.call('HDEL', KEYS[8], id)
      left = left - 1
      if left == 0 then
        break
      end
    end
  end
end
if ARGV[11] == '1' then
  park(KEYS[9], KEYS[6], ARGV[9])
end
local pending = redis.call('LLEN', KEYS[3])
if pending > 0 and not retry and not is_parked(KEYS[9]) then
  local now_ms = server_ms()
  local reply = {now_ms, pending, redis.call('LINDEX', KEYS[3], -1)}
  local limit = tonumber(ARGV[6])
  if limit > 0 then
    for i, entry in ipairs(redis.call('LRANGE', KEYS[3], 0, limit - 1)) do
      local id = id_of(entry)
      local attempts = attempts_of(id, i == 1) + 1
      redis.call('HSET', KEYS[8], id, attempts)
      if i == 1 then
        redis.call('SET', KEYS[4], attempts)
        redis.call('DEL', KEYS[9])  -- delivered: a retry's wait is over
      end
      reply[#reply + 1] = entry
      reply[#reply + 1] = attempts
    end
  end
  return reply
end
if pending == 0 then
  drained(KEYS[6], ARGV[9], KEYS[4], KEYS[8], KEYS[9], KEYS[5], KEYS[7])
end
