-- Finish a turn: ack the inbox head, drop its records, append history and events, record latencies; with nothing
-- left in the inbox, end the drain in the same step when asked (see _release.lua).
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts, 6 history, 7 events, 8 outbox, 9 meta, 10 stats,
--       11 queue-wait histogram, 12 run histogram,
--       13 drain flag, 14 runnable, 15 slots, 16 epoch, 17 dead letters, 18 web stream (released with the drain),
--       19 the shard's running set (the drain's entry leaves it on release or yield), 20 the shard's drain queue,
--       21 control, 22 approvals (the next attempt)
-- ARGV: 1 token, 2 ids JSON, 3 history entries JSON, 4 history maxlen, 5 events JSON, 6 events maxlen,
--       7 outbox keys JSON, 8 wait bucket, 9 wait s, 10 run bucket, 11 run s, 12 now ms,
--       13 '1' when the reply's send was dead-lettered (counted), else '0',
--       14 the conversation (ConversationRef JSON) of the turn's last channel message, or '' (kept in meta, so an
--          operator's message reaches the same chat: switchboard/control),
--       15 '1' = release the drain when the inbox is left empty, 16 session, 17 the session's idle TTL as begin read
--       it ('' = none: a history the turn creates gets it, the rest keep theirs, see _begin.lua),
--       18 the drain's entry ('' = none to close),
--       19 '1' = yield the slot when other drains wait in the shard and the inbox is not empty, '2' = yield whenever
--       the inbox is not empty (the worker has other shards' drains waiting) (fairness, as lease_yield.lua: the
--       lease freed and a new drain entry pushed at the back), 20 the new job id, 21 the new drain entry,
--       22 the shard's ready channel,
--       23 history entries to read for the drain's next attempt, started in the same step when the inbox is not
--       empty and the drain does not yield ('' = the drain begins it itself), 24 max messages folded under collect,
--       25 max attempts, 26 epoch, 27 worker, 28 now s
-- Returns {inbox length left, 1 when the drain was released, 2 when it yielded, 3 when the next attempt was started
-- (followed by that attempt, _begin.lua's layout), else 0}.
local refused = fenced() if refused then return refused end
local err = ack(KEYS[3], KEYS[4], KEYS[5], cjson.decode(ARGV[2])) if err then return err end
local entries = cjson.decode(ARGV[3])
if #entries > 0 then
  local maxlen = tonumber(ARGV[4])
  local n = redis.call('RPUSH', KEYS[6], unpack(entries))
  if n > maxlen then redis.call('LTRIM', KEYS[6], -maxlen, -1) end
  if n == #entries and ARGV[17] ~= '' then retain_for(KEYS, 6, 6, ARGV[17]) end  -- a history this turn began
end
append_events(KEYS[7], ARGV[6], cjson.decode(ARGV[5]))
local okeys = cjson.decode(ARGV[7])
if #okeys > 0 then redis.call('HDEL', KEYS[8], unpack(okeys)) end
if ARGV[14] ~= '' then
  redis.call('HSET', KEYS[9], 'last_at', ARGV[12], 'status', 'idle', 'conversation', ARGV[14])
else
  redis.call('HSET', KEYS[9], 'last_at', ARGV[12], 'status', 'idle')
end
redis.call('HINCRBY', KEYS[10], 'runs_completed', 1)
if ARGV[29] and ARGV[29] ~= '' then redis.call('HINCRBY', KEYS[10], ARGV[29], 1) end  -- a cancelled run (segments.py)
if ARGV[13] == '1' then redis.call('HINCRBY', KEYS[10], 'send_dead_letters', 1) end
-- a histogram's count is the sum of its buckets (stats.py): a bucket and the sum per observation
redis.call('HINCRBY', KEYS[11], ARGV[8], 1)
redis.call('HINCRBYFLOAT', KEYS[11], 'sum', ARGV[9])
redis.call('HINCRBY', KEYS[12], ARGV[10], 1)
redis.call('HINCRBYFLOAT', KEYS[12], 'sum', ARGV[11])
local left = redis.call('LLEN', KEYS[3])
if left > 0 then
  if ARGV[19] == '' or (ARGV[19] == '1' and redis.call('LLEN', KEYS[20]) == 0) then
    if ARGV[23] == '' then return {left, 0} end
    local next_attempt = start_attempt(
      {inbox = KEYS[3], messages = KEYS[4], attempts = KEYS[5], meta = KEYS[9], events = KEYS[7], drain = KEYS[13],
       history = KEYS[6], slots = KEYS[15], epoch = KEYS[16], outbox = KEYS[8], dead = KEYS[17], web = KEYS[18],
       control = KEYS[21], approvals = KEYS[22]},
      {max_collect = ARGV[24], max_attempts = ARGV[25], events_maxlen = ARGV[6], epoch = tonumber(ARGV[26]),
       worker = ARGV[27], now = ARGV[28], read_history = ARGV[23], new_epoch = false},
      redis.call('LINDEX', KEYS[3], 0))
    return {left, 3, next_attempt}
  end
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[13], ARGV[20])
  push_entry(KEYS[20], ARGV[21], ARGV[22])
  close_job(KEYS[19], ARGV[18])
  return {left, 2}
end
if ARGV[15] ~= '1' then return {left, 0} end
release(KEYS[1], KEYS[13], KEYS[14], ARGV[16], KEYS[19], ARGV[18])
return {0, 1}
