-- KEYS[1] lock key
-- returns {} when nobody holds the key, else {owner, remaining ms, token}
local value = redis.call('GET', KEYS[1])
if not value then
  return {}
end
local token, holder = parse(value)
if holder == '' then
  return {}
end
return {holder, redis.call('PTTL', KEYS[1]), token}
