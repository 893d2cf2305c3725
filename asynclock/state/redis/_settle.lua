-- Prepended to release.lua to make release_claimed: mark a dedupe claim done (its full TTL) in
-- the same atomic step as the release of the lock it was handled under (the dispatcher's one
-- round trip after a handler). Set whether or not the release finds the lock still owned: the
-- caller decides what a lost lock means for the event. The claim keeps its value (its owner);
-- one that is gone is created again, owned by the releasing owner.
-- KEYS[3] the claim key (it shares the lock key's hash tag) | ARGV[6] claim ttl_ms
if redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[6])) == 0 then
  redis.call('SET', KEYS[3], ARGV[1], 'PX', tonumber(ARGV[6]))
end
