-- A worker took a drain job off RQ's queue (BLMOVE into the intermediate list): register it as started the way
-- RQ's worker does, and hand back its payload. Returns false when the job hash is gone.
-- KEYS: 1 job hash, 2 started registry, 3 intermediate list
-- ARGV: 1 job id, 2 composite "<job id>:<execution id>", 3 heartbeat deadline (s), 4 now (RQ format), 5 worker
local data = redis.call('HGET', KEYS[1], 'data')
redis.call('LREM', KEYS[3], 1, ARGV[1])
if not data then return false end
redis.call('HSET', KEYS[1], 'status', 'started', 'started_at', ARGV[4], 'last_heartbeat', ARGV[4],
           'worker_name', ARGV[5])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
return data
