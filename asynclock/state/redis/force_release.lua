-- KEYS[1] lock key, KEYS[2] release channel | ARGV[1] token retention ms
-- Operator's force-release: free the key whoever holds it, keeping its last fencing token.
-- returns {owner, token} of the holder it had, or {} when nobody held it
local holder, token = held_by(KEYS[1])
if not holder then
  return {}
end
redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[1]))
redis.call('PUBLISH', KEYS[2], '')
return {holder, token}
