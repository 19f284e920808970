-- Replace a session's drain flag with a new drain job, unless a lease is held or the flag changed meanwhile.
-- KEYS: 1 lease, 2 drain flag, 3 job hash, 4 rq queue, 5 rq queues
-- ARGV: 1 expected flag ('' = absent), 2 job id, 3 session, 4 now (RQ format), 5 job cfg JSON (see _job.lua),
--       6 '1' to push at the head of the queue (a repaired or handed-over session), '' at the back
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local cur = redis.call('GET', KEYS[2]) or ''
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
push_job(KEYS[3], ARGV[2], ARGV[3], ARGV[4], cjson.decode(ARGV[5]), ARGV[6] == '1')
return 1
