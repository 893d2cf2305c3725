-- KEYS[1] lock key, KEYS[2] release channel, KEYS[3] the owner's abandon mark
-- ARGV[1] owner, ARGV[2] mark ttl_ms, ARGV[3] token retention ms, ARGV[4] reservation ms
-- An acquire whose reply the caller never saw (cancelled, timed out) may still be on its way.
-- Release the lock if that acquire already won; otherwise leave a mark that makes it fail
-- should it arrive later. returns 1 when a held lock was released, 0 otherwise
local value = redis.call('GET', KEYS[1])
if value then
  local token, holder, flag = parse(value)
  if holder == ARGV[1] then
    if flag ~= '' then
      redis.call('SET', KEYS[1], fmt(token) .. ' |' .. flag, 'PX', tonumber(ARGV[4]))
    else
      redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[3]))
    end
    redis.call('PUBLISH', KEYS[2], flag)
    return 1
  end
end
redis.call('SET', KEYS[3], '1', 'PX', tonumber(ARGV[2]))
return 0
