-- Set a poison message aside with its reason and ack it, so the session's next message runs.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts, 6 events, 7 session dead list, 8 shard's dead letters,
--       9 outbox, 10 stats, 11 meta
-- ARGV: 1 token, 2 ids JSON, 3 record JSON, 4 events JSON, 5 events maxlen, 6 outbox keys JSON,
--       7 per-session dead cap, 8 per-shard dead cap (trimmed exactly: a shard's stream is short), 9 now ms
local refused = fenced() if refused then return refused end
local err = ack(KEYS[3], KEYS[4], KEYS[5], cjson.decode(ARGV[2])) if err then return err end
if redis.call('LPUSH', KEYS[7], ARGV[3]) == 1 then  -- a list this created gets the web chat's idle TTL at once
  local ttl = redis.call('HGET', KEYS[11], 'idle_ttl')
  if ttl and ttl ~= '0' then retain_for(KEYS, 7, 7, ttl) end
end
redis.call('LTRIM', KEYS[7], 0, tonumber(ARGV[7]) - 1)
redis.call('XADD', KEYS[8], 'MAXLEN', ARGV[8], '*', 'record', ARGV[3])
append_events(KEYS[6], ARGV[5], cjson.decode(ARGV[4]))
local okeys = cjson.decode(ARGV[6])
if #okeys > 0 then redis.call('HDEL', KEYS[9], unpack(okeys)) end
redis.call('HINCRBY', KEYS[10], 'dead_letters', 1)
redis.call('HSET', KEYS[11], 'last_at', ARGV[9], 'status', 'idle')
return redis.call('LLEN', KEYS[3])
