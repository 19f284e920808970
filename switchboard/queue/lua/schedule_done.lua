-- Record what became of one claimed occurrence and drop it from the in-flight set.
-- KEYS: 1 in-flight ZSET, 2 job HASH
-- ARGV: 1 in-flight member or '' (a skip never in flight), 2 due (ms), 3 outcome (delivered | duplicate | skipped),
--       4 reason ('' when delivered), 5 now (ms), 6 message id or ''
-- Returns 1 (recorded), 0 (already recorded by another scheduler, or the job is gone)
if ARGV[1] ~= '' and redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'last_due', ARGV[2], 'last_outcome', ARGV[3], 'last_reason', ARGV[4],
  'last_at', ARGV[5], 'last_message_id', ARGV[6])
if ARGV[3] == 'skipped' then
  redis.call('HINCRBY', KEYS[2], 'skipped', 1)
else
  redis.call('HINCRBY', KEYS[2], 'fired', 1)
end
return 1
