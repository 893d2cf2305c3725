-- KEYS[1] the inbox, KEYS[2] the head's attempt count, KEYS[3] the dead letters, KEYS[4] the set
-- of keys with work, KEYS[5] its listing mark, KEYS[6] the key's lock, KEYS[7] the key's hold
-- (see _hold.lua), KEYS[8] its entry counter, KEYS[9] the attempt counts of entries that are not
-- the head (see _inbox_step.lua) | ARGV[1] the key (as the caller names it), ARGV[2]
-- the listing (see _listed.lua), ARGV[3] the hand-out lane, ARGV[4] the owner a hand-out
-- reserves the lock for, ARGV[5] its ttl_ms (see _handout.lua), ARGV[6] 'requeue'
-- (inbox_requeue) or 'discard' (inbox_discard)
-- requeue: puts every dead letter back in front of the inbox, in their order, with fresh attempt
-- counts (the next delivery is attempt 1); discard: deletes them. Either way the key is unparked
-- (a retry that waits is not cut short: the key stays waiting until it is due), it joins its set
-- of keys with work if entries are pending, and it is handed to one worker if nobody holds it and
-- no retry waits (without an entry: the worker takes it).
-- returns how many dead letters were put back (or deleted), or {-1, generation} when the set of
-- keys with work is not listed (nothing changed; the generation to list it under, '' for a fresh
-- one: see _listed.lua). A hand-out that found its lane elsewhere (see hand_out()) leaves the
-- key to a rescan.
local dead = redis.call('LLEN', KEYS[3])
local parked = is_parked(KEYS[7])
if dead == 0 and not parked then
  return 0
end
local pending = redis.call('LLEN', KEYS[1])
if ARGV[6] == 'requeue' then
  pending = pending + dead
end
if pending > 0 then
  local listable, generation = listed(KEYS[5], ARGV[2])
  if not listable then
    return {-1, generation}
  end
end
if ARGV[6] == 'requeue' and dead > 0 then
  -- the head goes behind the requeued entries: its count is kept until it is the head again
  local head = redis.call('LINDEX', KEYS[1], 0)
  local count = tonumber(redis.call('GET', KEYS[2]) or '0')
  if head and count > 0 then
    local kept = tonumber(redis.call('HGET', KEYS[9], id_of(head)) or '0')
    redis.call('HSET', KEYS[9], id_of(head), math.max(count, kept))
  end
  local letters = redis.call('LRANGE', KEYS[3], 0, -1)
  for i = #letters, 1, -1 do
    redis.call('LPUSH', KEYS[1], cjson.decode(letters[i])[1])
  end
  redis.call('DEL', KEYS[2])  -- the head changed: counts start afresh
end
redis.call('DEL', KEYS[3])
if parked then
  redis.call('DEL', KEYS[7])
end
if pending == 0 then
  -- nothing left of the key but its entry counter and a stale head count (discard only)
  redis.call('DEL', KEYS[2], KEYS[8], KEYS[9])
  return dead
end
local now_ms = server_ms()
redis.call('ZADD', KEYS[4], 'NX', now_ms, ARGV[1])
if not waits(KEYS[7], now_ms) then
  hand_out(KEYS[6], KEYS[1], KEYS[2], ARGV[3], ARGV[1], ARGV[4], tonumber(ARGV[5]), '0')
end
return dead
