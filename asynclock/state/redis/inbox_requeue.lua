-- KEYS[1] the inbox, KEYS[2] the head's attempt count, KEYS[3] the dead letters, KEYS[4] the set
-- of keys with work, KEYS[5] the inbox wake-up channel | ARGV[1] the key (as the caller names it)
-- Puts every dead letter back in front of the inbox, in their order, with fresh attempt counts.
-- returns how many were put back
local dead = redis.call('LRANGE', KEYS[3], 0, -1)
if #dead == 0 then
  return 0
end
for i = #dead, 1, -1 do
  redis.call('LPUSH', KEYS[1], cjson.decode(dead[i])[1])
end
redis.call('DEL', KEYS[3])
redis.call('DEL', KEYS[2])  -- the head changed: counts start afresh
local now = redis.call('TIME')
redis.call('ZADD', KEYS[4], 'NX', tonumber(now[1]) * 1000, ARGV[1])
redis.call('PUBLISH', KEYS[5], ARGV[1])
return #dead
