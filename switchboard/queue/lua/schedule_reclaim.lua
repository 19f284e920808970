-- Take over an in-flight occurrence whose scheduler missed its deadline: only the caller that still finds the
-- deadline it read wins, and sets a new one.
-- KEYS: 1 in-flight ZSET   ARGV: 1 member (<job id>|<due ms>), 2 the deadline it read (ms), 3 the new deadline (ms)
-- Returns 1 (taken over), 0 (another took it, or it was delivered)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
return 1
