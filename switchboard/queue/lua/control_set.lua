-- Take the conversation over (a SessionControl JSON) or hand it back (''), fenced by the session lease.
-- KEYS: 1 lease, 2 fenced, 3 control   ARGV: 1 token, 2 control JSON or ''
local refused = fenced() if refused then return refused end
if ARGV[2] == '' then return redis.call('DEL', KEYS[3]) end
redis.call('SET', KEYS[3], ARGV[2])
return 1
