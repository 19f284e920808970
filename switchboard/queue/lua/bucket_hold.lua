-- Hold send buckets for a while (a platform answered 429 with retry_after): no token until HOLD_MS have passed,
-- then one token, then the bucket's steady rate (no burst right after a 429). Never shortens a longer hold.
-- KEYS: the buckets   ARGV: 1 hold (ms), then per bucket its burst and its period (ms)
local now = limits_now()
local hold = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local limit, period = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
  if limit > 0 then
    -- meter_check's wait is tat + period / limit - period - now: make it HOLD_MS for the next take
    local held = now + hold + period - period / limit
    local tat = tonumber(redis.call('GET', key)) or now
    if held > tat then meter_commit(key, held, now) end
  end
end
return 0
