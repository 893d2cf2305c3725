-- KEYS[1] the key's line, KEYS[2] the places' holds | ARGV[1] turn
-- takes the turn out of the line (it gave up, or was served without the lock); returns 1 if it was in
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
