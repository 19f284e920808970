-- Record a failed attempt. KEYS: 1 lease, 2 fenced, 3 attempts, 4 events, 5 stats
-- ARGV: 1 token, 2 head message id, 3 error text, 4 run_failed JSON, 5 events maxlen,
--       6 the stats field counting the agent's failed runs (segments.py; '' or absent: none)
local refused = fenced() if refused then return refused end
redis.call('HSET', KEYS[3], ARGV[2] .. ':error', ARGV[3])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'run_failed', 'data', ARGV[4])
redis.call('HINCRBY', KEYS[5], 'runs_failed', 1)
if ARGV[6] and ARGV[6] ~= '' then redis.call('HINCRBY', KEYS[5], ARGV[6], 1) end
return 1
