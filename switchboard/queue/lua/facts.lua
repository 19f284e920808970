-- Write facts a drain held back (events, and a turn's metered usage into the totals) in one fenced step.
-- KEYS: 1 lease, 2 fenced, 3 events, 4 stats   ARGV: 1 token, 2 events maxlen, 3 facts JSON:
-- {events = [[kind, data JSON], ...], usage = [credits, input tokens, output tokens] (optional)}
-- (outbox_claim.lua writes the same JSON when held facts ride on a claim).
local refused = fenced() if refused then return refused end
local facts = cjson.decode(ARGV[3])
for i = 1, #facts.events do
  local e = facts.events[i]
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'kind', e[1], 'data', e[2])
end
local u = facts.usage
if type(u) == 'table' then
  redis.call('HINCRBYFLOAT', KEYS[4], 'credits', u[1])
  redis.call('HINCRBY', KEYS[4], 'input_tokens', u[2])
  redis.call('HINCRBY', KEYS[4], 'output_tokens', u[3])
end
return #facts.events
