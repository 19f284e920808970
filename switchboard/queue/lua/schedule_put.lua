-- Store a scheduled job and its first occurrence (all schedule keys share the hash tag {schedules}).
-- KEYS: 1 job HASH, 2 due ZSET, 3 the session's job SET, 4 the tenant's job SET
-- ARGV: 1 job id, 2 spec JSON, 3 session key, 4 tenant, 5 first due (ms) or '', 6 now (ms), 7 '1' to replace,
--       8 most jobs per session (0: no cap)
-- Returns 1 (stored), 0 (the id is taken), -1 (the session has its most jobs already)
local exists = redis.call('EXISTS', KEYS[1]) == 1
if exists and ARGV[7] ~= '1' then return 0 end
local cap = tonumber(ARGV[8])
if not exists and cap > 0 and redis.call('SCARD', KEYS[3]) >= cap then return -1 end
redis.call('HSET', KEYS[1], 'spec', ARGV[2], 'session', ARGV[3], 'tenant', ARGV[4], 'created_at', ARGV[6],
  'next_at', ARGV[5])
if ARGV[5] == '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[1])
return 1
