-- KEYS[1..7] the semaphore's (see _semaphore.lua)
-- returns {places kept, owner, ms left, token, owner, ms left, token, ...} of the live permits,
-- oldest first; changes nothing
local now = clock()
local out = {redis.call('ZCOUNT', P, '(' .. now, '+inf')}
local live = redis.call('ZRANGEBYSCORE', H, '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  out[#out + 1] = live[i]
  out[#out + 1] = tonumber(live[i + 1]) - now
  out[#out + 1] = redis.call('HGET', T, live[i])
end
return out
