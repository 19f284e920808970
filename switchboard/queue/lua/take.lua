-- A worker takes the next drain of one shard: pop the head of the shard's drain queue and register it as running
-- (its heartbeat deadline in the shard's running set), in one step; nothing is ever popped and left unregistered.
-- KEYS: 1 the shard's drain queue, 2 the shard's running set
-- ARGV: 1 heartbeat deadline (unix s)
-- Returns {entry, entries left} or {false, 0} when the queue was empty.
local entry = redis.call('LPOP', KEYS[1])
if not entry then return {false, 0} end
redis.call('ZADD', KEYS[2], ARGV[1], entry)
return {entry, redis.call('LLEN', KEYS[1])}
