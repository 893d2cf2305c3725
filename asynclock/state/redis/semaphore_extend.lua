-- KEYS[1..7] the semaphore's (see _semaphore.lua) | ARGV[1] owner, ARGV[2] ttl_ms,
-- ARGV[3] retention ms
-- returns 1 when owner's permit now expires ttl_ms from now, 0 when it holds none (a lost
-- permit is never re-created)
local now = clock()
local expires = tonumber(redis.call('ZSCORE', H, ARGV[1]))
if expires == nil or expires <= now then
  return 0
end
redis.call('ZADD', H, now + tonumber(ARGV[2]), ARGV[1])
keep(now, tonumber(ARGV[3]), false)
return 1
