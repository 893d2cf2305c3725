-- KEYS[1] the key's inbox (a list), KEYS[2] its entry counter, KEYS[3] the set of keys with work,
-- KEYS[4] the inbox wake-up channel, KEYS[5] the event's dedupe claim
-- ARGV[1] the entry's payload, ARGV[2] max_pending, ARGV[3] claim ttl_ms, ARGV[4] the key (as
-- the caller names it), ARGV[5] '1' when there is a claim
-- returns {status, pending}: 'duplicate' (the claim exists: nothing appended), 'full' (max_pending
-- entries pending: nothing appended) or 'accepted' (appended, claim recorded, key marked as having
-- work, workers woken). An entry reads "<id> <accepted ms> <payload>".
local pending = redis.call('LLEN', KEYS[1])
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[5]) == 1 then
  return {'duplicate', pending}
end
if pending >= tonumber(ARGV[2]) then
  return {'full', pending}
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[5], 'accepted', 'PX', tonumber(ARGV[3]))
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local id = redis.call('INCR', KEYS[2])
redis.call('RPUSH', KEYS[1], id .. ' ' .. ms .. ' ' .. ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', ms, ARGV[4])
redis.call('PUBLISH', KEYS[4], ARGV[4])
return {'accepted', pending + 1}
