-- Record a write effect's outcome under its key, or release the claim (empty record) after a failure.
-- KEYS: 1 lease, 2 fenced, 3 effect   ARGV: 1 token, 2 record JSON or '', 3 ttl ms
local refused = fenced() if refused then return refused end
if ARGV[2] == '' then return redis.call('DEL', KEYS[3]) end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
return 1
