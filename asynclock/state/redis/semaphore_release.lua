-- KEYS[1..7] the semaphore's (see _semaphore.lua) | ARGV[1] owner
-- returns 1 when owner's permit was given back, 0 when it held none (nothing changed).
-- Publishes the waiters this made eligible (a permit that expired meanwhile counts too).
local owner = ARGV[1]
local queued = redis.call('ZCARD', Q) > 0
local before = {}
if queued then
  before = eligible(redis.call('ZCARD', H))
end
purge((clock()))
if not redis.call('ZSCORE', H, owner) then
  return 0
end
redis.call('ZREM', H, owner)
redis.call('HDEL', T, owner)
if queued then
  wake(before)
end
return 1
