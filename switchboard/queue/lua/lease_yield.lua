-- Fairness: give the slot up between turns while other drains wait, without stranding the session. One step:
-- the lease is freed and a new drain entry for the session is pushed at the back of its shard's queue (the drain flag
-- points at it), so the inbox, untouched, keeps its order and the next drain resumes at its head. Nothing waiting in
-- the shard (unless the worker has drains of other shards waiting: ARGV[6]), or nothing left in the inbox (the
-- drain's next begin releases): no-op. The drain's own entry leaves the running set in the same step.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 drain flag, 5 the shard's drain queue, 6 the shard's running set
-- ARGV: 1 token, 2 new job id, 3 new drain entry, 4 the shard's ready channel, 5 the drain's entry ('' = none),
--       6 '1' = others wait elsewhere (yield even when the shard's queue is empty)
-- Returns 1 when the slot was given up, 0 otherwise (keep draining).
local refused = fenced() if refused then return refused end
if redis.call('LLEN', KEYS[3]) == 0 then return 0 end
if ARGV[6] ~= '1' and redis.call('LLEN', KEYS[5]) == 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[4], ARGV[2])
push_entry(KEYS[5], ARGV[3], ARGV[4])
close_job(KEYS[6], ARGV[5])
return 1
