-- KEYS[1] the dedupe record | ARGV[1] ttl_ms
-- Set the record to expire ttl_ms from now, keeping its value (a claim's owner); create it
-- (value '1') if it is gone. Atomic, so a record claimed meanwhile by someone else is never
-- overwritten with our value.
if redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1])) == 0 then
  redis.call('SET', KEYS[1], '1', 'PX', tonumber(ARGV[1]))
end
return 1
