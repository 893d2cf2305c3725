-- Shared prelude, prepended to every script when it is loaded (_scripts.py).
-- A lock key's value is one of:
--   "<token> <owner>"           held by owner
--   "<token> <owner>|<waiter>"  held, and a blocking waiter of another process (id <waiter>)
--                               asked for a turn: the holder releases instead of handing the
--                               lock to a waiter of its own process
--   "<token> |<waiter>"         released and reserved for a short while for <waiter>'s process
--   "<token>"                   free; remembers the last fencing token for the next acquirer
-- A held value may end in "\n<owner> <until ms>" entries: owners of the holder's process that
-- were abandoned while it held the key (see abandon.lua), which its release must not hand the
-- lock to. They live no longer than the hold: every script that ends it writes a value without
-- them.
-- parse(value) -> token (number), holder (string, '' when free/reserved), flag (string or ''),
-- marks (the "\n<owner> <until ms>" entries, or '')
local function parse(value)
  local marks = ''
  local nl = string.find(value, '\n', 1, true)
  if nl ~= nil then
    marks = string.sub(value, nl)
    value = string.sub(value, 1, nl - 1)
  end
  local sp = string.find(value, ' ', 1, true)
  if sp == nil then
    return tonumber(value), '', '', marks
  end
  local token = tonumber(string.sub(value, 1, sp - 1))
  local rest = string.sub(value, sp + 1)
  local bar = string.find(rest, '|', 1, true)
  if bar == nil then
    return token, rest, '', marks
  end
  return token, string.sub(rest, 1, bar - 1), string.sub(rest, bar + 1), marks
end

-- held_by(lock) -> holder, token, flag, marks of lock's value (see parse), or nil when nobody
-- holds the lock (no value, free or reserved)
local function held_by(lock)
  local value = redis.call('GET', lock)
  if not value then
    return nil
  end
  local token, holder, flag, marks = parse(value)
  if holder == '' then
    return nil
  end
  return holder, token, flag, marks
end

-- next_token(last) -> the fencing token of a new holder after last: the server's TIME in
-- microseconds, or last + 1 when that is not above last; and that TIME ({s, us})
local function next_token(last)
  local now = redis.call('TIME')
  local token = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token <= last then
    token = last + 1
  end
  return token, now
end

-- whether owner has an entry in marks (owner ids hold no whitespace)
local function marked(marks, owner)
  return string.find(marks, '\n' .. owner .. ' ', 1, true) ~= nil
end

-- tokens exceed 2^31, so never let Lua print them in exponent notation
local function fmt(token)
  return string.format('%.0f', token)
end
