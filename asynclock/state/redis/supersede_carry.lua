-- KEYS[1] the key's carried list | ARGV[1] ttl in ms, ARGV[2..] the encoded events, oldest first
-- Leave the events of an interrupted call for the key's next call (on_lock_conflict="supersede",
-- the newer event in another process): appended after any left before; the list expires ttl
-- after this call if nobody collects it.
-- returns the list's length
redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('LLEN', KEYS[1])
