-- Shared by facts and outbox_claim: write facts a drain held back (events, and a turn's metered usage into
-- the totals). facts JSON: {events = [[kind, data JSON], ...], usage = [credits, input, output] (optional),
-- segments = [[stats field, amount, 1 if a float], ...] (optional)}.
local function write_facts(events_key, maxlen, stats_key, facts_json)
  local facts = cjson.decode(facts_json)
  for i = 1, #facts.events do
    local e = facts.events[i]
    redis.call('XADD', events_key, 'MAXLEN', '~', maxlen, '*', 'kind', e[1], 'data', e[2])
  end
  local u = facts.usage
  if type(u) == 'table' then
    if tonumber(u[1]) ~= 0 then redis.call('HINCRBYFLOAT', stats_key, 'credits', u[1]) end  -- unpriced models
    redis.call('HINCRBY', stats_key, 'input_tokens', u[2])
    redis.call('HINCRBY', stats_key, 'output_tokens', u[3])
  end
  local seg = facts.segments  -- segmented metrics (segments.py): [[field, amount, is_float], ...]
  if type(seg) == 'table' then
    for i = 1, #seg do
      local s = seg[i]
      if s[3] == 1 then redis.call('HINCRBYFLOAT', stats_key, s[1], s[2]) else redis.call('HINCRBY', stats_key, s[1], s[2]) end
    end
  end
  return #facts.events
end
