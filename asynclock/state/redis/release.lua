-- KEYS[1] lock key, KEYS[2] release channel
-- ARGV[1] owner, ARGV[2] successor owner ('' = none),
-- ARGV[3] successor ttl_ms, ARGV[4] token retention ms, ARGV[5] reservation ms
-- returns -1 when owner does not hold the key (nothing changed), 0 when released, or the
-- successor's new fencing token (> 0) when the lock was handed straight to the successor.
-- A waiter of another process that flagged the key gets it reserved instead of a handoff, so a
-- process with a busy local queue cannot keep a lock from other processes forever.
local holder, token, flag, marks = held_by(KEYS[1])
if holder ~= ARGV[1] then
  return -1
end
-- a successor that gave up already (abandon.lua ran during this hold, see there) must not be
-- handed the lock; its mark is in the value read above, so checking it costs no command
if ARGV[2] ~= '' and flag == '' and not marked(marks, ARGV[2]) then
  redis.call('SET', KEYS[1], fmt(token + 1) .. ' ' .. ARGV[2], 'PX', tonumber(ARGV[3]))
  return token + 1
end
if flag ~= '' then
  redis.call('SET', KEYS[1], fmt(token) .. ' |' .. flag, 'PX', tonumber(ARGV[5]))
else
  redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[4]))
end
redis.call('PUBLISH', KEYS[2], flag)
return 0
