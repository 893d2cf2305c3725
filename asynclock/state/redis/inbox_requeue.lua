-- KEYS[1] the inbox, KEYS[2] the head's attempt count, KEYS[3] the dead letters, KEYS[4] the set
-- of keys with work, KEYS[5] its listing mark, KEYS[6] the key's lock | ARGV[1] the key (as the
-- caller names it), ARGV[2] the listing (see _listed.lua), ARGV[3] the hand-out lane, ARGV[4] the
-- owner a hand-out reserves the lock for, ARGV[5] its ttl_ms (see _handout.lua)
-- Puts every dead letter back in front of the inbox, in their order, with fresh attempt counts,
-- and hands the key to one worker if nobody holds it (without an entry: the worker takes it).
-- returns how many were put back, or {-1, generation} when the set of keys with work is not
-- listed (nothing changed; the generation to list it under, '' for a fresh one: see _listed.lua). A hand-out that found its lane elsewhere (see hand_out()) leaves the
-- key to a rescan.
local dead = redis.call('LRANGE', KEYS[3], 0, -1)
if #dead == 0 then
  return 0
end
local listable, generation = listed(KEYS[5], ARGV[2])
if not listable then
  return {-1, generation}
end
for i = #dead, 1, -1 do
  redis.call('LPUSH', KEYS[1], cjson.decode(dead[i])[1])
end
redis.call('DEL', KEYS[3])
redis.call('DEL', KEYS[2])  -- the head changed: counts start afresh
local now = redis.call('TIME')
redis.call('ZADD', KEYS[4], 'NX', tonumber(now[1]) * 1000, ARGV[1])
hand_out(KEYS[6], KEYS[1], KEYS[2], ARGV[3], ARGV[1], ARGV[4], tonumber(ARGV[5]), '0')
return #dead
