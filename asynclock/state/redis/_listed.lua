-- Prepended to inbox_accept.lua and inbox_requeue.lua: may a key be added to its set of keys
-- with work? On one server there is one set and the answer is always yes (listing ''). On Redis
-- Cluster there is one set per hash slot (a script reaches only its key's slot), and a directory
-- (other slots) lists the slots whose set may have members, so that a rescan reads those sets
-- and nothing else. A set's listing mark (in the set's slot) holds the generation under which
-- the directory lists its slot; while there is no mark, nothing is added to the set (listing '?':
-- the caller is told 'unlisted', writes a new generation into the directory and comes back with
-- it: that sets the mark). See _cluster_inbox.py for how a slot leaves the directory.
local function listed(mark, listing)
  if listing == '' or redis.call('EXISTS', mark) == 1 then
    return true
  end
  if listing == '?' then
    return false
  end
  redis.call('SET', mark, listing)
  return true
end
