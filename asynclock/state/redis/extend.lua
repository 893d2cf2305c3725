-- KEYS[1] lock key | ARGV[1] owner, ARGV[2] ttl_ms
-- returns 1 when the TTL was reset to ttl_ms, 0 when owner does not hold the key (a lost lock
-- is never re-created)
if held_by(KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return 1
