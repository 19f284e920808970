-- Take the session lease when nobody holds it; the new epoch is the fencing token. Returns 0 when held.
-- KEYS: 1 lease, 2 epoch counter   ARGV: 1 worker id, 2 lease ms
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local epoch = redis.call('INCR', KEYS[2])
if epoch == 1 then
  -- A new counter (or one that expired with an idle session's keys) starts at the server's time in ms, so an epoch
  -- is never handed out twice: a worker still holding an epoch from before the expiry can never pass the fence
  -- (the counter only expires after the idle TTL, many milliseconds after it was started). Milliseconds keep the
  -- epoch within 14 digits, which cjson (begin.lua's run_started fact) encodes exactly.
  local t = redis.call('TIME')
  epoch = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[2], string.format('%d', epoch))
end
redis.call('SET', KEYS[1], string.format('%d', epoch) .. ':' .. ARGV[1], 'PX', ARGV[2])
return epoch
