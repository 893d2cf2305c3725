-- KEYS[1] the key's lock, KEYS[2] its inbox, KEYS[3] the head's attempt count, KEYS[4] the key's
-- hold (see _hold.lua)
-- ARGV[1] the owner of a grant taken off the hand-out lane, ARGV[2] ttl_ms, ARGV[3] '1' to hand
-- the head entry out (see _handout.lua), ARGV[4] the key (as the caller names it), ARGV[5] the id
-- of the entry the grant handed out ('' for none), ARGV[6] the attempt count it gave it, ARGV[7]
-- '1' when the grant came without the head although the worker wants it (a requeue's hand-out,
-- which knows no deployment's with_entry: see inbox_requeue.lua)
-- A worker checks a grant that waited on the lane for long (its reservation may have run out) before
-- it drains the key. Returns 'held' when the reservation still holds (now for ARGV[2] ms: the grant
-- and the head it handed out stand), a new grant (see grant() in _handout.lua) when the lock was
-- free and the key still has work (the lock now held for ARGV[1]), else false (another worker
-- holds the key, or it was drained meanwhile: nothing to do). A new grant of the entry the old one
-- handed out does not count it again if its count is still the one the old grant gave it: nobody
-- delivered it since (a worker that did would have counted one more, or removed it).
-- With ARGV[7] '1' a reservation that holds is answered with a grant of it that hands the head
-- out (counted), as an accept's hand-out would have. With ARGV[3] '0' (a worker that takes its
-- batches itself) the head an accept's hand-out counted is given back if nobody delivered it (still
-- the head, with the count the grant gave it): an accept of a dispatcher with another policy than
-- the worker's hands heads out, and the worker's own take would count the head a second time. A
-- key with a hold (parked, or a retry not due yet) is not taken (false); one whose retry is due
-- is, which ends the wait.
local function still_handed(entries, attempts, id, count)
  if id == '' then
    return false
  end
  local head = redis.call('LINDEX', entries, 0)
  return head ~= false and id_of(head) == id and redis.call('GET', attempts) == count
end

local value = redis.call('GET', KEYS[1])
if value then
  local token, holder = parse(value)
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
    if ARGV[3] == '0' and still_handed(KEYS[2], KEYS[3], ARGV[5], ARGV[6]) then
      redis.call('DECR', KEYS[3])
    end
    if ARGV[7] == '1' and redis.call('LLEN', KEYS[2]) > 0 then
      return grant(KEYS[2], KEYS[3], ARGV[4], ARGV[1], token, redis.call('TIME'),
        tonumber(ARGV[2]), '1', false)
    end
    return 'held'
  end
end
if redis.call('LLEN', KEYS[2]) == 0 then
  return false
end
local token, now = free_token(KEYS[1])
if not token then
  return false
end
if waits(KEYS[4], tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)) then
  return false
end
redis.call('DEL', KEYS[4])
redis.call('SET', KEYS[1], fmt(token) .. ' ' .. ARGV[1], 'PX', tonumber(ARGV[2]))
local counted = still_handed(KEYS[2], KEYS[3], ARGV[5], ARGV[6])
if counted and ARGV[3] == '0' then
  redis.call('DECR', KEYS[3])  -- given back; a grant without the head counts nothing
end
return grant(KEYS[2], KEYS[3], ARGV[4], ARGV[1], token, now, tonumber(ARGV[2]), ARGV[3], counted)
