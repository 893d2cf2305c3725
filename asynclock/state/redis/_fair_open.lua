-- fair_acquire, part 1 of 2: acquire.lua (which follows) becomes the body of a local function, so
-- the line below can run it only in turn and act on its answer (acquire.lua stays one copy)
local function acquire()
