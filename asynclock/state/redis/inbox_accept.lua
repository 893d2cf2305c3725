-- KEYS[1] the key's inbox (a list), KEYS[2] its entry counter, KEYS[3] the set of keys with work,
-- KEYS[4] the event's dedupe claim, KEYS[5] the listing mark of the set of keys with work,
-- KEYS[6] the key's lock, KEYS[7] the head's attempt count, KEYS[8] the key's hold (_hold.lua)
-- ARGV[1] the entry's payload, ARGV[2] max_pending, ARGV[3] claim ttl_ms, ARGV[4] the key (as
-- the caller names it), ARGV[5] '1' when there is a claim, ARGV[6] the listing (see _listed.lua),
-- ARGV[7] the hand-out lane, ARGV[8] the owner a hand-out reserves the lock for, ARGV[9] its
-- ttl_ms, ARGV[10] '1' to hand the head entry out with it (see _handout.lua)
-- returns {status, pending, handed}: 'duplicate' (the claim exists: nothing appended), 'full'
-- (max_pending entries pending: nothing appended), 'unlisted' (see _listed.lua: nothing appended;
-- the third element is then the generation to list the slot under, '' for a fresh one)
-- or 'accepted' (appended, claim recorded, key marked as having work, and handed to one worker
-- unless the key's lock is held: its holder's drain step takes the entry, atomically with this
-- script); handed as hand_out() answers. An entry reads "<id> <accepted ms> <payload>".
-- A key with a hold (_hold.lua) is not handed out while the hold lasts: a parked key's entry is
-- appended and nothing else (the key stays out of the set of keys with work, so its slot need
-- not be listed); behind a retry that is not due the entry waits (the key's score stays its due
-- time); once the retry is due, the accept hands the key out as any other, which ends the wait.
local pending = redis.call('LLEN', KEYS[1])
if ARGV[5] == '1' and redis.call('EXISTS', KEYS[4]) == 1 then
  return {'duplicate', pending}
end
if pending >= tonumber(ARGV[2]) then
  return {'full', pending}
end
local parked = is_parked(KEYS[8])
if not parked then
  local listable, generation = listed(KEYS[5], ARGV[6])
  if not listable then
    return {'unlisted', pending, generation}
  end
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[4], 'accepted', 'PX', tonumber(ARGV[3]))
end
local ms = server_ms()
local id = redis.call('INCR', KEYS[2])
redis.call('RPUSH', KEYS[1], id .. ' ' .. ms .. ' ' .. ARGV[1])
if parked then
  return {'accepted', pending + 1, 0}
end
redis.call('ZADD', KEYS[3], 'NX', ms, ARGV[4])
local handed = 0
if not waits(KEYS[8], ms) then
  handed = hand_out(KEYS[6], KEYS[1], KEYS[7], ARGV[7], ARGV[4], ARGV[8], tonumber(ARGV[9]),
    ARGV[10])
  if handed == 1 then
    redis.call('DEL', KEYS[8])  -- handed out: a retry that was due is over
  end
end
return {'accepted', pending + 1, handed}
