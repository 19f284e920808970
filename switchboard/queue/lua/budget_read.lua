-- The credits spent so far on each budget counter of one run, and whether it was closed (what is left cannot pay
-- for a run: the run capped at it stopped for credits).
-- KEYS: the counters   ARGV: none
-- Returns one {spent or false, closed or false} per key
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HMGET', key, 'spent', 'closed')
end
return out
