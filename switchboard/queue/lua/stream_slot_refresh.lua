-- Push back the expiry of open web chat streams this process still holds (never re-adds a released one).
-- KEYS: session key, address key of stream 1, then of stream 2, ...; ARGV[1] ttl ms, ARGV[1 + n] id of stream n
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for n = 2, #ARGV do
  for j = 0, 1 do
    local key = KEYS[(n - 2) * 2 + 1 + j]
    if redis.call('ZADD', key, 'XX', 'CH', now + ttl, ARGV[n]) > 0 then
      redis.call('PEXPIRE', key, ttl)
    end
  end
end
return #ARGV - 1
