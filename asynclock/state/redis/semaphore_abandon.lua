-- KEYS[1..7] the semaphore's (see _semaphore.lua), KEYS[8] the owner's abandon mark
-- ARGV[1] owner, ARGV[2] mark ttl ms
-- An acquire whose reply the caller never saw may still be on its way, or the caller stops
-- waiting: give back owner's permit, take it out of the queue, and leave a mark that makes a
-- late acquire of owner fail (semaphore_acquire.lua looks at it). Publishes the waiters this
-- made eligible. Returns 0.
local owner = ARGV[1]
local before = eligible(redis.call('ZCARD', H))
purge((clock()))
redis.call('ZREM', H, owner)
redis.call('HDEL', T, owner)
redis.call('ZREM', Q, owner)
redis.call('ZREM', P, owner)
redis.call('HDEL', L, owner)
redis.call('SET', KEYS[8], '1', 'PX', tonumber(ARGV[2]))
if redis.call('ZCARD', Q) > 0 then
  wake(before)
end
return 0
