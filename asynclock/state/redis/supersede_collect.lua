-- KEYS[1] the key's carried list
-- Take every event left for the key's next call, oldest first, and delete the list: one step, so
-- two collectors never both get an event.
-- returns the encoded events
local events = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return events
