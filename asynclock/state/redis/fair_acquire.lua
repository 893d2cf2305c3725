-- fair_acquire, part 2 of 2 (after _fair_open.lua + acquire.lua): the `end` below closes acquire()
-- KEYS[1] lock key, KEYS[2] this owner's abandon mark, KEYS[3] the key's line (zset: turn ->
-- first-conflict ms), KEYS[4] the places' holds (zset: turn -> kept-until ms)
-- ARGV[1] owner, ARGV[2] ttl_ms, ARGV[3] '' (acquire.lua: not waiting), ARGV[4] turn,
-- ARGV[5] hold_ms
-- returns what acquire.lua returns: the new fencing token (> 0), or -(ms to retry after) (<= 0)
end
local turn = ARGV[4]
local hold_ms = tonumber(ARGV[5])
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
-- places whose hold ran out leave the line: a vanished job blocks nobody for longer than that
local gone = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms)
if #gone > 0 then
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('ZREM', KEYS[4], unpack(gone))
end
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
local answer
if head == nil or head == turn then
  answer = acquire()
  if answer > 0 then
    redis.call('ZREM', KEYS[3], turn)
    redis.call('ZREM', KEYS[4], turn)
    return answer
  end
else
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    answer = -pttl  -- held (or reserved by release.lua for a waiter): until then
  else
    answer = -math.max(tonumber(redis.call('ZSCORE', KEYS[4], head)) - now_ms, 0)
  end
end
-- refused: take a place (first conflict: now) and keep it `hold` past the holder's expiry
local held_ms = math.max(redis.call('PTTL', KEYS[1]), 0)
redis.call('ZADD', KEYS[3], 'NX', now_ms, turn)
redis.call('ZADD', KEYS[4], now_ms + held_ms + hold_ms, turn)
-- the line outlives its last place by nothing more than the longest hold in it
local last = tonumber(redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2])
redis.call('PEXPIRE', KEYS[3], math.max(last - now_ms, 1))
redis.call('PEXPIRE', KEYS[4], math.max(last - now_ms, 1))
return answer
