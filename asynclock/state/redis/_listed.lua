-- Prepended to inbox_accept.lua and inbox_requeue.lua: may a key be added to its set of keys
-- with work? On one server there is one set and the answer is always yes (listing ''). On Redis
-- Cluster there is one set per hash slot (a script reaches only its key's slot), and a directory
-- (other slots) lists the slots whose set may have members, so that a rescan reads those sets
-- and nothing else. A set's listing mark (in the set's slot) holds the generation under which
-- the directory lists its slot; while there is no mark, nothing is added to the set (listing '?':
-- the caller is told 'unlisted', writes a new generation into the directory and comes back with
-- it: that sets the mark). See _cluster_inbox.py for how a slot leaves the directory.
-- listed(mark, listing) -> true when the key may join its set; else false and the generation the
-- caller must write into the directory before it comes back with it: '' for a fresh one (the slot
-- is not listed), or the mark's own when the caller came with another. Two accepts that list an
-- unlisted slot at once each write a generation into the directory, and only the first sets the
-- mark: the other is sent back to write the mark's, so the directory ends with the mark's
-- generation, which is what a pruning compares (else the entry would stay forever).
local function listed(mark, listing)
  if listing == '' then
    return true
  end
  local current = redis.call('GET', mark)
  if current then
    if listing == '?' or current == listing then
      return true
    end
    return false, current
  end
  if listing == '?' then
    return false, ''
  end
  redis.call('SET', mark, listing)
  return true
end
