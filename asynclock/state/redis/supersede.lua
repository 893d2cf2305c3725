-- KEYS[1] lock key, KEYS[2] supersede channel | ARGV[1] fencing token of the holder to signal
-- Tell the holder of the key that a newer event arrived (on_lock_conflict="supersede"), if the
-- key is still held under that token: a holder that has gone is not signalled, nor its successor.
-- returns 1 when the signal was published, 0 otherwise
local target = tonumber(ARGV[1])
local holder, token = held_by(KEYS[1])
if not holder or token ~= target then
  return 0
end
redis.call('PUBLISH', KEYS[2], ARGV[1])
return 1
