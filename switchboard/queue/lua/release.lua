-- Release without stranding: only an empty inbox ends the drain; otherwise the caller keeps draining.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 drain flag, 5 runnable   ARGV: 1 token, 2 session
local refused = fenced() if refused then return refused end
if redis.call('LLEN', KEYS[3]) > 0 then return 0 end
redis.call('DEL', KEYS[1], KEYS[4])
redis.call('ZREM', KEYS[5], ARGV[2])
return 1
