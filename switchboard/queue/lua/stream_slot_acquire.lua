-- Take a slot for one open web chat stream in one set of open streams (a session's, or a client address's): one of
-- the two steps of taking a stream's slot (queue/streamslots.py), each set in its own slot on a cluster.
-- KEYS[1] the open streams (ZSET id -> expiry ms)   ARGV[1] stream id, ARGV[2] ttl ms, ARGV[3] cap (> 0)
-- Returns 0 when taken, 1 when the cap refused it (a refusal writes nothing but dropping expired entries).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 1
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return 0
