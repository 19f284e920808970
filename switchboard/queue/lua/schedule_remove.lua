-- Remove a scheduled job (its in-flight occurrence, if any, finds no job and is dropped).
-- KEYS: 1 job HASH, 2 due ZSET, 3 the session's job SET, 4 the tenant's job SET   ARGV: 1 job id
-- Returns 1 (removed), 0 (no such job)
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('SREM', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
