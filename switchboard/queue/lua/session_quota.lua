-- Count one session creation against a client address's meter (see _limits.lua).
-- KEYS: 1 address meter
-- ARGV: 1 sessions allowed per period (0 = no limit), 2 period ms
-- Returns the wait in ms: 0 = allowed (and counted), else refused with nothing written.
local now = limits_now()
local wait, tat = meter_check(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
if wait > 0 then return wait end
meter_commit(KEYS[1], tat, now)
return 0
