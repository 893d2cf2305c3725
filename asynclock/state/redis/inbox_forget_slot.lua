-- Redis Cluster: remove a slot from the directory of slots with work (its block's hash), only if
-- the entry still holds the generation whose listing mark inbox_unlist.lua removed. A newer
-- generation means an accept listed the slot again meanwhile: the entry stays (see _listed.lua).
-- KEYS[1] the directory hash of the slot's block (slot -> generation) | ARGV[1] the slot,
-- ARGV[2] the generation
-- returns 1 when removed, else 0
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
