-- Claim one occurrence of a job, once: only the caller that still finds the job due at ARGV[2] wins. In the same
-- script the job's next occurrence replaces it, and (when it is to be fired) the occurrence is recorded in flight
-- until ARGV[4]: a scheduler that dies before it is delivered leaves it there for another to fire again (its
-- ingest dedup key makes a second delivery a duplicate).
-- KEYS: 1 due ZSET, 2 in-flight ZSET, 3 job HASH
-- ARGV: 1 job id, 2 due (ms) the caller read, 3 next due (ms) or '' (none), 4 in-flight deadline (ms),
--       5 '1' fire / '0' skip, 6 now (ms)
-- Returns 1 (claimed), 0 (another scheduler claimed it, or the job changed or is gone)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) or redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
end
redis.call('HSET', KEYS[3], 'next_at', ARGV[3], 'claimed_at', ARGV[6])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1] .. '|' .. ARGV[2])
end
return 1
