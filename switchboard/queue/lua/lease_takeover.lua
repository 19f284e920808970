-- Take a session over from a dead worker (its liveness key expired): free the lease only if it still holds the
-- value the reaper saw, and push a new drain job in the same step. The lease stays the fence: should the worker
-- come back, its token no longer matches and its next write is refused. The job goes to the head of the queue: the
-- session was running when its worker died, so it resumes before the sessions that have not started yet.
-- KEYS: 1 lease, 2 drain flag, 3 job hash, 4 rq queue, 5 rq queues
-- ARGV: 1 lease value seen, 2 new job id, 3 session, 4 now (RQ format), 5 job cfg JSON (see _job.lua)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2])
push_job(KEYS[3], ARGV[2], ARGV[3], ARGV[4], cjson.decode(ARGV[5]), true)
return 1
