-- Shared by facts and outbox_claim: write facts a drain held back (events, and a turn's metered usage into
-- the totals). facts JSON: {events = [[kind, data JSON], ...], usage = [credits, input, output] (optional)}.
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
  return #facts.events
end
