-- KEYS[1] a set of keys with work (see _ready.py; one per slot on a cluster)
-- returns {server ms, key 1, score 1, key 2, score 2, ...}: every member, oldest first, with its
-- score (the accept time of its oldest work, or the due time of the retry it waits for: see
-- _hold.lua) and the clock of the server that holds the set, so that the caller tells the keys
-- that are due (score <= server ms) from the ones still waiting, by the clock that set the scores
local reply = {server_ms()}
for _, item in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')) do
  reply[#reply + 1] = item
end
return reply
