-- Abuse limits as GCRA meters ("leaky bucket as a meter"): at most LIMIT events in any PERIOD_MS, a burst of
-- LIMIT included. Each meter is one STRING holding its theoretical arrival time (ms), expiring once that time
-- has passed, so an idle meter costs nothing. A refused event changes nothing: callers check every meter first
-- and commit only when all of them allow. Time is the server's (TIME), shared by every web process.
local function limits_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Returns the wait in ms (0 = allowed) and, when allowed, the arrival time to commit. LIMIT <= 0 = no limit.
-- meter_wait: the same for a meter whose value the caller has read (several meters in one MGET).
local function meter_wait(value, limit, period_ms, now)
  limit = tonumber(limit)
  if limit <= 0 then return 0, nil end
  local tat = tonumber(value) or now
  if tat < now then tat = now end
  local next_tat = tat + period_ms / limit
  local wait = next_tat - period_ms - now
  if wait > 0 then return math.ceil(wait), nil end
  return 0, next_tat
end

local function meter_check(key, limit, period_ms, now)
  if tonumber(limit) <= 0 then return 0, nil end
  return meter_wait(redis.call('GET', key), limit, period_ms, now)
end

local function meter_commit(key, tat, now)
  if tat then
    redis.call('SET', key, string.format('%.0f', math.ceil(tat)), 'PX', math.max(1, math.ceil(tat - now)))
  end
end
