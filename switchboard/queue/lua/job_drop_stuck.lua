-- The reaper gives up a drain job stuck in RQ's intermediate list (its worker died between BLMOVE and registering
-- it, a lease TTL ago): drop the id and delete the job hash in one step. The session's drain flag then points at a
-- job that is gone, which the next sweep repairs as soon as no lease is held, and a worker that registers the job
-- late finds nothing (job_start returns false). A job registered meanwhile has left the list: left alone.
-- KEYS: 1 intermediate list, 2 job hash, 3 first-seen mark
-- ARGV: 1 job id
redis.call('DEL', KEYS[3])
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
return 1
