-- Redis Cluster: read the directory hashes of slots with work that one master holds, in one
-- request (see _cluster_inbox.py). The others are keys of other slots, which a script may touch
-- on its own node (as the hand-out lane: _handout.lua).
-- KEYS[1] one directory hash (it routes the script) | ARGV the others believed on that master
-- returns, for KEYS[1] then each of ARGV, the slots it lists (its fields), or false for a hash
-- that is not on this master (the slots moved: the caller reads that one alone)
local found = {redis.call('HKEYS', KEYS[1])}
for i = 1, #ARGV do
  local slots = redis.pcall('HKEYS', ARGV[i])
  if type(slots) == 'table' and slots.err then
    slots = false
  end
  found[i + 1] = slots
end
return found
