-- KEYS[1] the claim key | ARGV[1] the owner that recorded it (claim_acquire.lua)
-- Compare-and-delete: returns 1 when the claim was the owner's and is gone now, 0 when it was
-- absent or someone else's (a duplicate's claim attempt of unknown outcome must never erase the
-- record of the delivery that was handled).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
