-- Take the session lease when nobody holds it; the new epoch is the fencing token. Returns 0 when held.
-- KEYS: 1 lease, 2 epoch counter   ARGV: 1 worker id, 2 lease ms
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], epoch .. ':' .. ARGV[1], 'PX', ARGV[2])
return epoch
