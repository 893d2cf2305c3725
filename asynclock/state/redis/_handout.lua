-- Prepended (after _value.lua) to inbox_accept.lua, inbox_requeue.lua and inbox_adopt.lua: hand a
-- key with work and no holder to ONE worker. The key's lock is reserved for a fresh owner (as an
-- acquire would take it: the next fencing token, the TTL by the server's clock) and a grant is
-- pushed onto the hand-out lane, which idle workers BRPOP: Redis gives each element to one of
-- them. A worker that took a grant drains the key as that owner; one that died with it leaves the
-- reservation to expire, and the key to a rescan.
-- The lane is named in ARGV, not KEYS: on a cluster it lives on the key's master but in another
-- slot (see _lanes.py), which a script may touch but a command may not declare.

-- free_token(lock) -> the fencing token a new holder of lock gets (as acquire.lua computes it) and
-- the server's time {s, us}, or nil when somebody holds the lock or it is reserved for a waiter of
-- another process
local function free_token(lock)
  local value = redis.call('GET', lock)
  local last = 0
  if value then
    local token, holder, flag = parse(value)
    if holder ~= '' or flag ~= '' then
      return nil
    end
    last = token or 0
  end
  return next_token(last)
end

-- grant(entries, attempts, key, owner, token, now, ttl_ms, with_entry, counted) -> the grant as
-- JSON: {key, owner, token, server ms, ttl ms[, head entry, its attempt count, entries pending]};
-- with with_entry ('1') the head is handed out: its attempt count goes up by one, unless counted
-- (an earlier grant of it counted it, and nobody delivered it since: see inbox_adopt.lua)
local function grant(entries, attempts, key, owner, token, now, ttl_ms, with_entry, counted)
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local item = {key, owner, fmt(token), ms, ttl_ms}
  if with_entry == '1' then
    item[6] = redis.call('LINDEX', entries, 0)
    if counted then
      item[7] = tonumber(redis.call('GET', attempts) or '0')
    else
      item[7] = redis.call('INCR', attempts)
    end
    item[8] = redis.call('LLEN', entries)
  end
  return cjson.encode(item)
end

-- hand_out(lock, entries, attempts, lane, key, owner, ttl_ms, with_entry) -> 1 when the key was
-- handed out, 0 when its lock is held or reserved (its holder drains it), -1 when the lane is not
-- on this server (a cluster whose slots moved: nothing changed, the caller looks the lanes up again)
local function hand_out(lock, entries, attempts, lane, key, owner, ttl_ms, with_entry)
  local token, now = free_token(lock)
  if not token then
    return 0
  end
  local item = grant(entries, attempts, key, owner, token, now, ttl_ms, with_entry, false)
  local pushed = redis.pcall('LPUSH', lane, item)
  if type(pushed) == 'table' and pushed.err then
    if with_entry == '1' then
      redis.call('DECR', attempts)  -- not handed out after all
    end
    return -1
  end
  redis.call('SET', lock, fmt(token) .. ' ' .. owner, 'PX', ttl_ms)
  return 1
end
