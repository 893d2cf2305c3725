-- KEYS[1] lock key, KEYS[2] this owner's abandon mark | ARGV[1] owner, ARGV[2] ttl_ms, ARGV[3] waiter id of this process ('' when
-- the caller will not wait)
-- returns the new fencing token (> 0), or -(the holder's remaining ms) (<= 0) when the key is held
-- The token is max(last token + 1, server TIME in microseconds): strictly increasing per key
-- while the free key remembers its last token, and still increasing after that memory expired
-- unless a key saw more than one acquisition per microsecond on average.
-- The abandon mark is looked at only before this script changes something (a grant, a waiting
-- flag): a refusal that changes nothing is the same whether or not the caller gave up, and it is
-- the common answer under contention, so it costs no EXISTS.
local owner = ARGV[1]
local ttl_ms = tonumber(ARGV[2])
local waiter = ARGV[3]
local function given_up()
  -- the caller gave this attempt up (abandon.lua ran first): never grant it, never flag for it
  return redis.call('EXISTS', KEYS[2]) == 1
end
local value = redis.call('GET', KEYS[1])
local last = 0
if value then
  local token, holder, flag, marks = parse(value)
  last = token or 0
  if holder == owner then
    return last  -- a retried call that already won: idempotent
  end
  local reserved_for_us = holder == '' and flag ~= '' and flag == waiter
  if holder ~= '' or (flag ~= '' and not reserved_for_us) then
    if waiter ~= '' and flag == '' then
      if given_up() then
        return -ttl_ms
      end
      redis.call('SET', KEYS[1], fmt(token) .. ' ' .. holder .. '|' .. waiter .. marks, 'KEEPTTL')
    end
    local pttl = redis.call('PTTL', KEYS[1])
    if pttl < 0 then
      pttl = ttl_ms  -- no expiry set by someone else: bound the wait by our own TTL
    end
    if holder == '' and pttl > 20 then
      -- reserved for another process, which takes it within a round trip without publishing
      -- anything: look again soon, so this waiter can flag the new holder and be served next
      -- instead of sleeping out the whole reservation
      pttl = 20
    end
    return -pttl
  end
end
if given_up() then
  return -ttl_ms
end
local token = next_token(last)
redis.call('SET', KEYS[1], fmt(token) .. ' ' .. owner, 'PX', ttl_ms)
return token
