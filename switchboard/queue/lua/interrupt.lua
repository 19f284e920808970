-- A turn interrupted by a newer message (interrupt policy) ends as a cancelled run without acking anything: its
-- attempt is handed back (an interrupt is not a failure) and counted as an interrupt of its head instead, so the next
-- turn, which takes the head and everything behind it, restarts with them all; past a few interrupts it runs to the
-- end (a flood of messages cannot starve the session). The run's outbox records go (the caller keeps its preview's:
-- the restarted turn has the same run id and edits that preview).
-- KEYS: 1 lease, 2 fenced, 3 attempts, 4 events, 5 outbox
-- ARGV: 1 token, 2 head message id, 3 run_cancelled JSON, 4 events maxlen, 5 outbox keys JSON
-- Returns the head's interrupts so far.
local refused = fenced() if refused then return refused end
if tonumber(redis.call('HGET', KEYS[3], ARGV[2]) or '0') > 0 then redis.call('HINCRBY', KEYS[3], ARGV[2], -1) end
local n = redis.call('HINCRBY', KEYS[3], ARGV[2] .. ':interrupts', 1)
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'run_cancelled', 'data', ARGV[3])
local okeys = cjson.decode(ARGV[5])
if #okeys > 0 then redis.call('HDEL', KEYS[5], unpack(okeys)) end
return n
