-- Shared by complete and dead_letter: remove exactly the handled ids from the inbox head.
local function ack(inbox, messages, attempts, ids)
  local n = #ids
  local head = redis.call('LRANGE', inbox, 0, n - 1)
  for i = 1, n do
    if head[i] ~= ids[i] then return redis.error_reply('NOTHEAD inbox head is not the handled message') end
  end
  redis.call('LTRIM', inbox, n, -1)
  redis.call('HDEL', messages, unpack(ids))
  local h = ids[1]
  redis.call('HDEL', attempts, h, h .. ':error', h .. ':deferrals', h .. ':interrupts', h .. ':took')
  return nil
end
local function append_events(stream, maxlen, events)
  for i = 1, #events do
    local kind = cjson.decode(events[i]).kind
    redis.call('XADD', stream, 'MAXLEN', '~', maxlen, '*', 'kind', kind, 'data', events[i])
  end
end
