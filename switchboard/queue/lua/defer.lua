-- Put the inbox head off (the model provider asked to wait). The attempt that ran is handed back: a rate limit is
-- not the message failing. The drain then gives the lease up; its drain flag stays (pointing at the finishing job),
-- so ingest enqueues no drain meanwhile, and the reaper gives the session a new one once the deferral is due.
-- KEYS: 1 lease, 2 fenced, 3 attempts, 4 events, 5 deferred zset, 6 stats, 7 meta
-- ARGV: 1 token, 2 head message id, 3 reason, 4 run_deferred JSON, 5 events maxlen, 6 until (unix s), 7 session,
--       8 max deferrals
-- Returns the head's deferrals so far, or 0 (nothing changed) when it already had the maximum.
local refused = fenced() if refused then return refused end
local field = ARGV[2] .. ':deferrals'
if tonumber(redis.call('HGET', KEYS[3], field) or '0') >= tonumber(ARGV[8]) then return 0 end
local n = redis.call('HINCRBY', KEYS[3], field, 1)
if tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0') > 0 then redis.call('HINCRBY', KEYS[3], ARGV[2], -1) end
redis.call('HSET', KEYS[3], ARGV[2] .. ':error', ARGV[3])
redis.call('ZADD', KEYS[5], ARGV[6], ARGV[7])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'run_deferred', 'data', ARGV[4])
redis.call('HINCRBY', KEYS[6], 'runs_deferred', 1)
redis.call('HSET', KEYS[7], 'status', 'deferred')
return n
