-- One sender's message-rate meter (GCRA, see _limits.lua), on the sender's own slot: a sender may write into several
-- sessions, so its meter is no session's and is checked in a step of its own, before ingest (queue/ingest.py).
-- KEYS[1] the sender's meter   ARGV[1] messages per period (> 0), ARGV[2] period ms, ARGV[3] 'take' or 'give'
-- take: returns the wait in ms (0 = counted; refused: nothing written).
-- give: hands back one message counted by a take whose message ingest then refused (the arrival time moves back by
--       one message's share of the period); returns 1.
local now = limits_now()
local period = tonumber(ARGV[2])
if ARGV[3] == 'take' then
  local wait, tat = meter_check(KEYS[1], ARGV[1], period, now)
  if wait > 0 then return wait end
  meter_commit(KEYS[1], tat, now)
  return 0
end
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat then
  tat = tat - period / tonumber(ARGV[1])
  if tat <= now then redis.call('DEL', KEYS[1]) else meter_commit(KEYS[1], tat, now) end
end
return 1
