-- Prepended to the inbox scripts that finish, hand out or put back entries: a key's *hold*, what
-- keeps its work from being handed out although nobody holds its lock. The hold is a string
-- P{key}:inbox:hold, in the key's slot, and it is one of:
--   '<due ms>'  a retry waits (inbox_step / inbox_take with retry_in): the head stays at the
--               head with its attempt count, and is due at that time by the server's clock. The
--               key's score in its set of keys with work is the due time too, so a rescan
--               (inbox_ready.lua) sees which keys are due without reading their holds. Handing
--               the head out (an accept or a take that finds it due, a holder's step) ends it.
--   'p'         the key is parked (park=True): its head went to the dead letters and nothing is
--               handed out until inbox_requeue.lua or inbox_discard.lua. A parked key is not in
--               its set of keys with work, so no rescan reads it (an accept appends to it without
--               listing it); inbox_keys finds it by its hold (a SCAN), as it finds dead letters.
-- No hold: the key's work is handed out as soon as its lock is free.

-- id_of(entry) -> the id of an inbox entry "<id> <accepted ms> <payload>"
local function id_of(entry)
  return string.sub(entry, 1, string.find(entry, ' ', 1, true) - 1)
end

-- server_ms() -> the server's clock in ms
local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- is_parked(hold) -> whether the key is parked
local function is_parked(hold)
  return redis.call('GET', hold) == 'p'
end

-- waits(hold, now_ms) -> whether the key's work may not be handed out at now_ms: it is parked,
-- or a retry waits that is not due yet
local function waits(hold, now_ms)
  local value = redis.call('GET', hold)
  if not value then
    return false
  end
  if value == 'p' then
    return true
  end
  return tonumber(value) > now_ms
end

-- wait_for_retry(hold, ready, key, retry_ms): the key waits retry_ms from now for its head
local function wait_for_retry(hold, ready, key, retry_ms)
  local due = server_ms() + retry_ms
  redis.call('SET', hold, due)
  redis.call('ZADD', ready, due, key)
end

-- drained(ready, key, head_count, counts, hold, dead, counter): key's inbox is empty: the key
-- leaves its set of keys with work and its attempt counts go; unless it is parked, its hold goes
-- too, and, with no dead letters either, its entry counter
local function drained(ready, key, head_count, counts, hold, dead, counter)
  redis.call('ZREM', ready, key)
  redis.call('DEL', head_count, counts)
  if not is_parked(hold) then
    redis.call('DEL', hold)
    if redis.call('LLEN', dead) == 0 then
      redis.call('DEL', counter)
    end
  end
end

-- park(hold, ready, key): the key is parked and leaves its set of keys with work
local function park(hold, ready, key)
  redis.call('SET', hold, 'p')
  redis.call('ZREM', ready, key)
end
