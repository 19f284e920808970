-- Finish a turn: ack the inbox head, drop its records, append history and events, record latencies.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts, 6 history, 7 events, 8 outbox, 9 meta, 10 stats,
--       11 queue-wait histogram, 12 run histogram
-- ARGV: 1 token, 2 ids JSON, 3 history entries JSON, 4 history maxlen, 5 events JSON, 6 events maxlen,
--       7 outbox keys JSON, 8 wait bucket, 9 wait s, 10 run bucket, 11 run s, 12 now ms,
--       13 '1' when the reply's send was dead-lettered (counted), else '0',
--       14 the conversation (ConversationRef JSON) of the turn's last channel message, or '' (kept in meta, so an
--          operator's message reaches the same chat: switchboard/control)
-- Returns the inbox length left.
local refused = fenced() if refused then return refused end
local err = ack(KEYS[3], KEYS[4], KEYS[5], cjson.decode(ARGV[2])) if err then return err end
local entries = cjson.decode(ARGV[3])
if #entries > 0 then
  redis.call('RPUSH', KEYS[6], unpack(entries))
  redis.call('LTRIM', KEYS[6], -tonumber(ARGV[4]), -1)
end
append_events(KEYS[7], ARGV[6], cjson.decode(ARGV[5]))
local okeys = cjson.decode(ARGV[7])
if #okeys > 0 then redis.call('HDEL', KEYS[8], unpack(okeys)) end
redis.call('HSET', KEYS[9], 'last_at', ARGV[12], 'status', 'idle')
if ARGV[14] and ARGV[14] ~= '' then redis.call('HSET', KEYS[9], 'conversation', ARGV[14]) end
redis.call('HINCRBY', KEYS[10], 'runs_completed', 1)
if ARGV[13] == '1' then redis.call('HINCRBY', KEYS[10], 'send_dead_letters', 1) end
redis.call('HINCRBY', KEYS[11], ARGV[8], 1)
redis.call('HINCRBY', KEYS[11], 'count', 1)
redis.call('HINCRBYFLOAT', KEYS[11], 'sum', ARGV[9])
redis.call('HINCRBY', KEYS[12], ARGV[10], 1)
redis.call('HINCRBY', KEYS[12], 'count', 1)
redis.call('HINCRBYFLOAT', KEYS[12], 'sum', ARGV[11])
return redis.call('LLEN', KEYS[3])
