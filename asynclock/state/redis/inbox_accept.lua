-- KEYS[1] the key's inbox (a list), KEYS[2] its entry counter, KEYS[3] the set of keys with work,
-- KEYS[4] the event's dedupe claim, KEYS[5] the listing mark of the set of keys with work,
-- KEYS[6] the key's lock
-- ARGV[1] the entry's payload, ARGV[2] max_pending, ARGV[3] claim ttl_ms, ARGV[4] the key (as
-- the caller names it), ARGV[5] '1' when there is a claim, ARGV[6] the listing (see _listed.lua),
-- ARGV[7] the inbox wake-up channel (not a key: on a cluster it is broadcast, see
-- _cluster_inbox.py)
-- returns {status, pending}: 'duplicate' (the claim exists: nothing appended), 'full' (max_pending
-- entries pending: nothing appended), 'unlisted' (see _listed.lua: nothing appended) or
-- 'accepted' (appended, claim recorded, key marked as having work, workers woken unless the key's
-- lock is held: its holder's drain step takes the entry, see inbox_watch). An entry reads
-- "<id> <accepted ms> <payload>".
local pending = redis.call('LLEN', KEYS[1])
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[4]) == 1 then
  return {'duplicate', pending}
end
if pending >= tonumber(ARGV[2]) then
  return {'full', pending}
end
if not listed(KEYS[5], ARGV[6]) then
  return {'unlisted', pending}
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[4], 'accepted', 'PX', tonumber(ARGV[3]))
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local id = redis.call('INCR', KEYS[2])
redis.call('RPUSH', KEYS[1], id .. ' ' .. ms .. ' ' .. ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', ms, ARGV[4])
-- a held lock's holder is draining the key (or will hand it to a drainer): its next step takes the
-- entry, atomically with this script, so no worker needs waking (a free lock keeps its last
-- token with no holder, see _value.lua)
local lock = redis.call('GET', KEYS[6])
local holder = ''
if lock then
  local _
  _, holder = parse(lock)
end
if holder == '' then
  redis.call('PUBLISH', ARGV[7], ARGV[4])
end
return {'accepted', pending + 1}
