-- Prepended to inbox_accept.lua and inbox_requeue.lua: may a key be added to its set of keys
-- with work? On one server there is one set and the answer is always yes (listing ''). On Redis
-- Cluster there is one set per hash slot (a script reaches only its key's slot), and a directory
-- (hashes in other slots) lists the slots whose set may have members, so that a rescan reads
-- those sets and nothing else. A set's listing mark (in the set's slot) holds the generation
-- under which the directory lists its slot; while there is no mark, nothing is added to the set.
-- The listing a caller first comes with is '?<generation> <slot> <directory>' (a fresh
-- generation, and the hash of the directory that lists the slot): when there is no mark, the
-- script writes that generation into the directory itself, then sets the mark. The directory
-- is in another slot (an undeclared key, allowed to scripts without flags as the hand-out lane
-- is: _handout.lua), chosen so that it is usually on this master (_cluster_inbox.py); when it is
-- not (a slot range boundary, or slots moving), the caller is told 'unlisted', writes a fresh
-- generation into the directory through the cluster and comes back with that generation alone
-- as its listing: that sets the mark. See _cluster_inbox.py for how a slot leaves the directory.
-- listed(mark, listing) -> true when the key may join its set; else false and the generation the
-- caller must write into the directory before it comes back with it: '' for a fresh one (the slot
-- is not listed), or the mark's own when the caller came with another. Two accepts that list an
-- unlisted slot through the cluster at once each write a generation into the directory, and only
-- the first sets the mark: the other is sent back to write the mark's, so the directory ends with
-- the mark's generation, which is what a pruning compares (else the entry would stay forever).
local function listed(mark, listing)
  if listing == '' then
    return true
  end
  local fresh, slot, directory = string.match(listing, '^%?(%S+) (%d+) (.*)$')
  local current = redis.call('GET', mark)
  if current then
    if fresh or current == listing then
      return true
    end
    return false, current
  end
  if fresh then
    local written = redis.pcall('HSET', directory, slot, fresh)
    if type(written) == 'table' and written.err then
      return false, ''  -- the directory is on another master: list through the cluster
    end
    listing = fresh
  end
  redis.call('SET', mark, listing)
  return true
end
