-- Shared by lease_acquire and begin (a drain's first step): take a lease nobody holds. The epoch counter's next value
-- is the fencing token. A new counter (or one that expired with an idle session's keys) starts at the server's time
-- in ms, so an epoch is never handed out twice: a worker still holding an epoch from before the expiry can never pass
-- the fence (the counter only expires after the idle TTL, many milliseconds after it was started). Milliseconds keep
-- the epoch within 14 digits, which cjson (the run_started fact) encodes exactly.
-- Returns the epoch, and whether this call created the counter.
local function take_lease(lease_key, epoch_key, holder, lease_ms)
  local epoch = redis.call('INCR', epoch_key)
  local created = epoch == 1
  if created then
    local t = redis.call('TIME')
    epoch = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('SET', epoch_key, string.format('%d', epoch))
  end
  redis.call('SET', lease_key, string.format('%d', epoch) .. ':' .. holder, 'PX', lease_ms)
  return epoch, created
end
