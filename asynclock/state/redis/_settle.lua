-- Prepended to release.lua to make release_claimed: mark a dedupe claim done (its full TTL) in
-- the same atomic step as the release of the lock it was handled under (the dispatcher's one
-- round trip after a handler). Set whether or not the release finds the lock still owned: the
-- caller decides what a lost lock means for the event.
-- KEYS[4] the claim key (it shares the lock key's hash tag) | ARGV[6] claim ttl_ms
redis.call('SET', KEYS[4], '1', 'PX', tonumber(ARGV[6]))
