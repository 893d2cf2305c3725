-- Shared prelude, prepended to acquire/release/extend/inspect when they are loaded.
-- A lock key's value is one of:
--   "<token> <owner>"           held by owner
--   "<token> <owner>|<waiter>"  held, and a blocking waiter of another process (id <waiter>)
--                               asked for a turn: the holder releases instead of handing the
--                               lock to a waiter of its own process
--   "<token> |<waiter>"         released and reserved for a short while for <waiter>'s process
--   "<token>"                   free; remembers the last fencing token for the next acquirer
-- parse(value) -> token (number), holder (string, '' when free/reserved), flag (string or '')
local function parse(value)
  local sp = string.find(value, ' ', 1, true)
  if sp == nil then
    return tonumber(value), '', ''
  end
  local token = tonumber(string.sub(value, 1, sp - 1))
  local rest = string.sub(value, sp + 1)
  local bar = string.find(rest, '|', 1, true)
  if bar == nil then
    return token, rest, ''
  end
  return token, string.sub(rest, 1, bar - 1), string.sub(rest, bar + 1)
end

-- tokens exceed 2^31, so never let Lua print them in exponent notation
local function fmt(token)
  return string.format('%.0f', token)
end
