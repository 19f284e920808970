-- Fairness: give the slot up between turns while other drain jobs wait, without stranding the session. One step:
-- the lease is freed and a new drain job for the session is pushed at the back of the queue (the drain flag points
-- at it), so the inbox, untouched, keeps its order and the next drain resumes at its head. Nothing waiting, or
-- nothing left in the inbox (the drain's next begin releases): no-op.
-- The drain's own job is closed in the same step (see _release.lua).
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 drain flag, 5 job hash, 6 rq queue, 7 rq queues, 8 the drain's job hash,
--       9 RQ started registry
-- ARGV: 1 token, 2 new job id, 3 session, 4 now (RQ format), 5 job cfg JSON (see _job.lua),
--       6 the drain's job composite ('' = no job to close)
-- Returns 1 when the slot was given up, 0 otherwise (keep draining).
local refused = fenced() if refused then return refused end
if redis.call('LLEN', KEYS[6]) == 0 or redis.call('LLEN', KEYS[3]) == 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[4], ARGV[2])
push_job(KEYS[5], ARGV[2], ARGV[3], ARGV[4], cjson.decode(ARGV[5]))
close_job(ARGV[6] ~= '' and KEYS[8], KEYS[9], ARGV[6])
return 1
