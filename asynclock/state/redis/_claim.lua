-- Prepended to acquire.lua to make claim_acquire: record a dedupe claim and, only if it is new,
-- acquire the lock, in one atomic step (the dispatcher's one round trip per fresh event).
-- KEYS[3] the claim key (it shares the lock key's hash tag) | ARGV[4] claim ttl_ms
-- The claim's value is the acquiring owner, so forget_claim.lua can tell it from another's.
-- returns nil when the claim existed (a duplicate: nothing acquired), else as acquire.lua
if not redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', tonumber(ARGV[4])) then
  return false
end
