-- Take a session over from a dead worker (its liveness key expired): free the lease only if it still holds the
-- value the reaper saw, and queue a new drain in the same step. The lease stays the fence: should the worker
-- come back, its token no longer matches and its next write is refused. The entry goes to the head of the shard's
-- queue: the session was running when its worker died, so it resumes before the sessions that have not started yet.
-- The dead drain's entry (the one its flag names) leaves the shard's running set.
-- KEYS: 1 lease, 2 drain flag, 3 the shard's drain queue, 4 the shard's running set
-- ARGV: 1 lease value seen, 2 new job id, 3 new drain entry, 4 the shard's ready channel, 5 session
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local old = redis.call('GET', KEYS[2])
if old then redis.call('ZREM', KEYS[4], ARGV[5] .. '|' .. old) end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[2])
push_entry(KEYS[3], ARGV[3], ARGV[4], true)
return 1
