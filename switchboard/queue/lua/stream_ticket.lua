-- Issue one web chat stream ticket, counted against its session's ticket meter (see _limits.lua).
-- KEYS: 1 session's ticket meter, 2 ticket
-- ARGV: 1 tickets allowed per period (0 = no limit), 2 period ms, 3 the ticket's value (its token's hash), 4 TTL s
-- Returns the wait in ms: 0 = stored (and counted), else refused with nothing written.
local now = limits_now()
local wait, tat = meter_check(KEYS[1], ARGV[1], tonumber(ARGV[2]), now)
if wait > 0 then return wait end
meter_commit(KEYS[1], tat, now)
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
return 0
