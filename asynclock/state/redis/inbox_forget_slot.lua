-- Redis Cluster: remove a slot from one shard of the directory of slots with work, only if the
-- entry still holds the generation whose listing mark inbox_unlist.lua removed. A newer generation
-- means an accept listed the slot again meanwhile: the entry stays (see _listed.lua).
-- KEYS[1] the directory shard (a hash: slot -> generation) | ARGV[1] the slot, ARGV[2] generation
-- returns 1 when removed, else 0
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
