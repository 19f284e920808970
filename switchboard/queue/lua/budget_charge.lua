-- Charge one metered run to its budget counters, all at once, and report each alert threshold crossed for the first
-- time this period (marked in the counter, so a threshold is reported once however many workers charge).
-- KEYS: 1 the tenant's counter index (ZSET), 2 its alert stream, 3.. the counters
-- A counter whose credits left were the run's cap (it bound the run) is closed when the run stopped for credits.
-- ARGV: 1 credits, 2 now (Unix s), 3 alert stream cap, 4 the run's cap when it stopped for credits (else ""),
--       then 6 per counter: budget, expire at (Unix s),
--       thresholds ("0.8,1"), scope, subject, period stamp
-- Returns a flat list: for each crossing, the counter's position (1-based), the threshold, the spend after the charge
local credits = tonumber(ARGV[1])
local now = ARGV[2]
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
local out = {}
for i = 3, #KEYS do
  local base = 5 + (i - 3) * 6
  local budget = tonumber(ARGV[base])
  local expire_at = ARGV[base + 1]
  local spent = tonumber(redis.call('HINCRBYFLOAT', KEYS[i], 'spent', credits))
  redis.call('HSET', KEYS[i], 'budget', ARGV[base], 'scope', ARGV[base + 3], 'subject', ARGV[base + 4],
    'period', ARGV[base + 5])
  if ARGV[4] ~= '' and budget - (spent - credits) <= tonumber(ARGV[4]) + 1e-9 then
    redis.call('HSET', KEYS[i], 'closed', '1')
  end
  redis.call('EXPIREAT', KEYS[i], expire_at)
  redis.call('ZADD', KEYS[1], expire_at, KEYS[i])
  for threshold in string.gmatch(ARGV[base + 2], '[^,]+') do
    if spent >= tonumber(threshold) * budget - 1e-9 and redis.call('HSETNX', KEYS[i], 'alert:' .. threshold, now) == 1 then
      redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 'at', now, 'scope', ARGV[base + 3],
        'subject', ARGV[base + 4], 'period', ARGV[base + 5], 'threshold', threshold, 'spent', tostring(spent),
        'credits', ARGV[base])
      out[#out + 1] = i - 2
      out[#out + 1] = threshold
      out[#out + 1] = tostring(spent)
    end
  end
end
return out
