-- Take one token from every send bucket named, or none: the outbound rate limits (per bot account, per chat, and
-- the streaming edit budget), shared by every worker. Each bucket is a GCRA meter of _limits.lua: LIMIT = the
-- bucket's burst, PERIOD_MS = the time the rate takes to refill a whole burst. A refused take changes nothing.
-- KEYS: the buckets   ARGV: per bucket, its burst and its period (ms)
-- Returns 0 (a token taken from each) or the wait in ms before every bucket has one.
local now = limits_now()
local wait, tats = 0, {}
for i, key in ipairs(KEYS) do
  local w, tat = meter_check(key, ARGV[2 * i - 1], tonumber(ARGV[2 * i]), now)
  if w > wait then wait = w end
  tats[i] = tat
end
if wait > 0 then return wait end
for i, key in ipairs(KEYS) do meter_commit(key, tats[i], now) end
return 0
