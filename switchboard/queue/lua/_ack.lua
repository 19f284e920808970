-- Shared by complete and dead_letter: remove exactly the handled ids from the inbox head.
local function ack(inbox, messages, attempts, ids)
  local n = #ids
  local head = redis.call('LPOP', inbox, n)
  if not head then head = {} end
  for i = 1, n do
    if head[i] ~= ids[i] then
      local back = {}  -- put back as it was: nothing changes
      for j = #head, 1, -1 do back[#back + 1] = head[j] end
      if #back > 0 then redis.call('LPUSH', inbox, unpack(back)) end
      return redis.error_reply('NOTHEAD inbox head is not the handled message')
    end
  end
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
