-- KEYS[1..7] the semaphore's (see _semaphore.lua), KEYS[8] this owner's abandon mark
-- ARGV[1] owner, ARGV[2] limit, ARGV[3] ttl_ms, ARGV[4] hold_ms (0: a try, which keeps no place),
-- ARGV[5] retention ms
-- returns the permit's fencing token (> 0), or -(ms until a permit or a place ahead expires)
local owner = ARGV[1]
local limit = tonumber(ARGV[2])
local ttl_ms = tonumber(ARGV[3])
local hold_ms = tonumber(ARGV[4])
local retention = tonumber(ARGV[5])
local now, now_us = clock()
local waiting = purge(now)
if redis.call('ZSCORE', H, owner) then
  -- a repeated call that won already: the same token, its TTL reset from now
  redis.call('ZADD', H, now + ttl_ms, owner)
  keep(now, retention, false)
  return tonumber(redis.call('HGET', T, owner))
end
if redis.call('EXISTS', KEYS[8]) == 1 then
  return -ttl_ms -- given up (semaphore_abandon.lua ran first): never granted, never queued
end
local held = redis.call('ZCARD', H)
local rank = false
if waiting > 0 then
  rank = redis.call('ZRANK', Q, owner)
end
local position = rank or waiting
local fits = held + position < limit
if fits and position > 0 then
  fits = #eligible(held) >= position -- everyone ahead fits too
end
if fits then
  if rank then
    redis.call('ZREM', Q, owner)
    redis.call('ZREM', P, owner)
    redis.call('HDEL', L, owner)
  end
  local token = next_token(now_us)
  redis.call('ZADD', H, now + ttl_ms, owner)
  redis.call('HSET', T, owner, fmt(token))
  keep(now, retention, false)
  return token
end
if hold_ms > 0 then
  if not rank then
    redis.call('ZADD', Q, redis.call('HINCRBY', M, 'seq', 1), owner)
  end
  redis.call('ZADD', P, now + hold_ms, owner)
  redis.call('HSET', L, owner, limit)
  keep(now, retention, true)
end
return -retry_ms(now, math.min(position, limit), ttl_ms)
