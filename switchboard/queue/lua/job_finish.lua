-- Close a drain job's RQ bookkeeping. KEYS: 1 job hash, 2 started registry, 3 failed registry
-- ARGV: 1 job id, 2 composite, 3 'finished'|'failed', 4 ended_at (RQ format), 5 result ttl, 6 failure ttl,
--       7 now (s), 8 exc_info (zlib) for failures
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[3] == 'finished' then
  if tonumber(ARGV[5]) == 0 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('HSET', KEYS[1], 'status', 'finished', 'ended_at', ARGV[4])
    redis.call('EXPIRE', KEYS[1], ARGV[5])
  end
else
  redis.call('HSET', KEYS[1], 'status', 'failed', 'ended_at', ARGV[4], 'exc_info', ARGV[8])
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  redis.call('ZADD', KEYS[3], tonumber(ARGV[7]) + tonumber(ARGV[6]), ARGV[1])
end
return 1
