-- KEYS[1] lock key, KEYS[2] release channel, KEYS[3] the owner's abandon mark
-- ARGV[1] owner, ARGV[2] mark ttl_ms, ARGV[3] token retention ms, ARGV[4] reservation ms,
-- ARGV[5] the caller's waiter id (its state instance)
-- An acquire whose reply the caller never saw (cancelled, timed out) may still be on its way.
-- Release the lock if that acquire already won; otherwise leave a mark that makes it fail
-- should it arrive later. Either way, withdraw the caller's waiting flag or reservation: its
-- process has stopped waiting, so nobody should give way to it any more.
-- The mark is a key of its own (acquire.lua looks at it), and, while the key is held by another
-- owner of the same process, also an entry "\n<owner> <until ms>" in the lock's value: a handoff
-- to owner can only come from a release by a holder of its own process (a process hands the lock
-- to its own waiters), and release.lua finds the entry in the value it reads anyway. An entry
-- lasts as long as the hold or until its mark key expires, whichever is first; expired ones are
-- dropped here when a new one is added.
-- returns 1 when a held lock was released, 0 otherwise
local owner = ARGV[1]
local mark_ms = tonumber(ARGV[2])
local waiter = ARGV[5]

-- the "<host>:<pid>" of an asynclock owner id ("<host>:<pid>:<task id>:<random>"); nil for ids
-- of another form, which are all taken for one process
local function process_of(id)
  return string.match(id, '^(.*):[^:]*:[^:]*$')
end

-- marks plus the entry of owner, without the entries that expired
local function with_mark(marks)
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local kept = {}
  for entry, until_ms in string.gmatch(marks, '\n(%S+) (%d+)') do
    if tonumber(until_ms) > now_ms then
      kept[#kept + 1] = '\n' .. entry .. ' ' .. until_ms
    end
  end
  kept[#kept + 1] = '\n' .. owner .. ' ' .. fmt(now_ms + mark_ms)
  return table.concat(kept)
end

local value = redis.call('GET', KEYS[1])
if value then
  local token, holder, flag, marks = parse(value)
  if holder == owner then
    if flag ~= '' and flag ~= waiter then
      redis.call('SET', KEYS[1], fmt(token) .. ' |' .. flag, 'PX', tonumber(ARGV[4]))
    else
      redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[3]))
      flag = ''
    end
    redis.call('PUBLISH', KEYS[2], flag)
    return 1
  end
  local ours = flag ~= '' and flag == waiter
  if holder == '' then
    if ours then
      -- reserved for us, and we no longer want it: free it for everyone else now
      redis.call('SET', KEYS[1], fmt(token), 'PX', tonumber(ARGV[3]))
      redis.call('PUBLISH', KEYS[2], '')
    end
  else
    local mark = process_of(holder) == process_of(owner) and not marked(marks, owner)
    if ours or mark then
      if ours then
        flag = ''
      end
      if mark then
        marks = with_mark(marks)
      end
      local head = fmt(token) .. ' ' .. holder
      if flag ~= '' then
        head = head .. '|' .. flag
      end
      redis.call('SET', KEYS[1], head .. marks, 'KEEPTTL')
    end
  end
end
redis.call('SET', KEYS[3], '1', 'PX', mark_ms)
return 0
