-- KEYS[1] lock key, KEYS[2] release channel, KEYS[3] the owner's abandon mark
-- ARGV[1] owner, ARGV[2] mark ttl_ms, ARGV[3] token retention ms, ARGV[4] reservation ms,
-- ARGV[5] the caller's waiter id (its state instance)
-- An acquire whose reply the caller never saw (cancelled, timed out) may still be on its way.
-- Release the lock if that acquire already won; otherwise leave a mark that makes it fail
-- should it arrive later. Either way, withdraw the caller's waiting flag or reservation: its
-- process has stopped waiting, so nobody should give way to it any more.
-- returns 1 when a held lock was released, 0 otherwise
local value = redis.call('GET', KEYS[1])
if value then
  local token, holder, flag = parse(value)
  if holder == ARGV[1] then
    if flag ~= '' and flag ~= ARGV[5] then
      redis.call('SET', KEYS[1], fmt(token) .. ' |' .. flag, 'PX', tonumber(ARGV[4]))
    else
      redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[3]))
      flag = ''
    end
    redis.call('PUBLISH', KEYS[2], flag)
    return 1
  end
  if flag ~= '' and flag == ARGV[5] then
    if holder == '' then
      -- reserved for us, and we no longer want it: free it for everyone else now
      redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[3]))
      redis.call('PUBLISH', KEYS[2], '')
    else
      redis.call('SET', KEYS[1], fmt(token) .. ' ' .. holder, 'KEEPTTL')
    end
  end
end
redis.call('SET', KEYS[3], '1', 'PX', tonumber(ARGV[2]))
return 0
