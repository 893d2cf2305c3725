-- Redis Cluster: take a slot's set of keys with work off the directory, if it is empty.
-- KEYS[1] the slot's set of keys with work, KEYS[2] its listing mark (see _listed.lua)
-- returns the generation the mark held (the caller then removes the directory's entry only if it
-- still holds that generation: inbox_forget_slot.lua), or false when the set has members or there
-- was no mark (nothing changed)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local generation = redis.call('GET', KEYS[2])
if generation then
  redis.call('DEL', KEYS[2])
end
return generation
