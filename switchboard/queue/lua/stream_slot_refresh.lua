-- Push back the expiry of open web chat streams this process still holds in one set (never re-adds a released one).
-- KEYS[1] the open streams (a session's or an address's)   ARGV[1] ttl ms, ARGV[1 + n] id of stream n
-- Returns how many are still held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local held = 0
for n = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + ttl, ARGV[n]) > 0 then
    held = held + 1
  end
end
if held > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return held
