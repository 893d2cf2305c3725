-- Prelude of the semaphore scripts (after _value.lua, for fmt). One semaphore's keys, all under
-- its key's hash tag (one slot on a cluster):
--   KEYS[1] holders  ZSET  owner -> its permit's expiry (ms, server clock)
--   KEYS[2] tokens   HASH  owner -> its permit's fencing token
--   KEYS[3] meta     HASH  'token' -> the last token issued, 'seq' -> the last queue number
--   KEYS[4] queue    ZSET  owner -> queue number (arrival order of the waiters)
--   KEYS[5] places   ZSET  owner -> until when its place in the queue is kept (ms)
--   KEYS[6] limits   HASH  owner -> the limit it waits with
--   KEYS[7] the wake channel: a script publishes the waiters it made eligible, space-separated
-- A waiter at queue position p (0: the head) may take a permit while it, and every waiter
-- ahead of it, fits held + p < its limit: strict arrival order.
local H, T, M, Q, P, L, C = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

-- the server clock: (ms, µs)
local function clock()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return math.floor(us / 1000), us
end

-- call command(key, names...) for names in chunks (unpack has a stack limit)
local function each_chunk(command, key, names)
  for i = 1, #names, 1000 do
    redis.call(command, key, unpack(names, i, math.min(i + 999, #names)))
  end
end

-- drop the permits and the places that expired; returns how many places are kept (the queue is
-- looked at only when it has any: an uncontended key costs one ZCARD for it)
local function purge(now)
  local gone = redis.call('ZRANGEBYSCORE', H, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', H, '-inf', now)
    each_chunk('HDEL', T, gone)
  end
  local waiting = redis.call('ZCARD', Q)
  if waiting > 0 then
    local late = redis.call('ZRANGEBYSCORE', P, '-inf', now)
    if #late > 0 then
      redis.call('ZREMRANGEBYSCORE', P, '-inf', now)
      each_chunk('ZREM', Q, late)
      each_chunk('HDEL', L, late)
      waiting = waiting - #late
    end
  end
  return waiting
end

-- the waiters at the head of the queue that may take a permit with `held` taken (at most
-- as many as the largest limit among them: the walk stops at the first that does not fit)
local function eligible(held)
  local found = {}
  local position = 0
  while true do
    local entry = redis.call('ZRANGE', Q, position, position)
    if #entry == 0 then
      break
    end
    local limit = tonumber(redis.call('HGET', L, entry[1]))
    if limit == nil or held + position >= limit then
      break
    end
    found[#found + 1] = entry[1]
    position = position + 1
  end
  return found
end

-- publish the waiters eligible now that were not in `before` (call it only when the queue
-- had places: an empty one has nobody to wake)
local function wake(before)
  local seen = {}
  for _, owner in ipairs(before) do
    seen[owner] = true
  end
  local fresh = {}
  for _, owner in ipairs(eligible(redis.call('ZCARD', H))) do
    if not seen[owner] then
      fresh[#fresh + 1] = owner
    end
  end
  if #fresh > 0 then
    redis.call('PUBLISH', C, table.concat(fresh, ' '))
  end
end

-- keep the keys until `retention` ms after the last permit (and, with `queued`, the last place)
-- expires; only the keys this step wrote need it
local function keep(now, retention, queued)
  local top = redis.call('ZRANGE', H, -1, -1, 'WITHSCORES')
  local last = now
  if #top > 0 then
    last = math.max(last, tonumber(top[2]))
  end
  if queued then
    top = redis.call('ZRANGE', P, -1, -1, 'WITHSCORES')
    if #top > 0 then
      last = math.max(last, tonumber(top[2]))
    end
    redis.call('PEXPIRE', Q, last - now + retention)
    redis.call('PEXPIRE', P, last - now + retention)
    redis.call('PEXPIRE', L, last - now + retention)
  end
  redis.call('PEXPIRE', H, last - now + retention)
  redis.call('PEXPIRE', T, last - now + retention)
  redis.call('PEXPIRE', M, last - now + retention)
end

-- max(last token + 1, server TIME in microseconds): strictly increasing per key
local function next_token(now_us)
  local token = now_us
  local last = tonumber(redis.call('HGET', M, 'token') or '0')
  if token <= last then
    token = last + 1
  end
  redis.call('HSET', M, 'token', fmt(token))
  return token
end

-- ms until the first permit held, or place kept among the first `ahead` waiters, expires
local function retry_ms(now, ahead, fallback)
  local first = nil
  local top = redis.call('ZRANGE', H, 0, 0, 'WITHSCORES')
  if #top > 0 then
    first = tonumber(top[2])
  end
  if ahead > 0 then
    for _, owner in ipairs(redis.call('ZRANGE', Q, 0, ahead - 1)) do
      local until_ms = tonumber(redis.call('ZSCORE', P, owner))
      if until_ms ~= nil and (first == nil or until_ms < first) then
        first = until_ms
      end
    end
  end
  if first == nil then
    return fallback
  end
  return math.max(first - now, 0)
end
