-- Take a slot for one open web chat stream, counted per session and per client address across processes.
-- KEYS[1] session's open streams (ZSET id -> expiry ms), KEYS[2] address's open streams
-- ARGV[1] stream id, ARGV[2] ttl ms, ARGV[3] session cap, ARGV[4] address cap (0 = no limit)
-- Returns 0 when taken, else the index (1 session, 2 address) of the cap that refused it; a refusal writes nothing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
for i = 1, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  local cap = tonumber(ARGV[2 + i])
  if cap > 0 and redis.call('ZCARD', KEYS[i]) >= cap then
    return i
  end
end
for i = 1, 2 do
  redis.call('ZADD', KEYS[i], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 0
