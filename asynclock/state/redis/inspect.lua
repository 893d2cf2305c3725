-- KEYS[1] lock key
-- returns {} when nobody holds the key, else {owner, remaining ms, token}
local holder, token = held_by(KEYS[1])
if not holder then
  return {}
end
return {holder, redis.call('PTTL', KEYS[1]), token}
