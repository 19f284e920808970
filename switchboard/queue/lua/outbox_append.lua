-- Deliver a send whose delivery is a stream append (the web chat), exactly once: the entry and the outbox's 'sent'
-- record are written together, so no kill falls between them; an entry already recorded is not appended again.
-- KEYS: 1 lease, 2 fenced, 3 stream, 4 outbox, 5 stats
-- ARGV: 1 token, 2 stream maxlen, 3 idempotency key, 4 now (s), 5 byte budget (0 = none; see _retention.lua),
--       6.. field/value pairs
-- Returns the entry id (the recorded one when it was already delivered).
local refused = fenced() if refused then return refused end
local cur = redis.call('HGET', KEYS[4], ARGV[3])
local record = cur and cjson.decode(cur) or nil
if record and record.state == 'sent' and type(record.platform_ids) == 'table' and record.platform_ids[1] then
  return record.platform_ids[1]
end
local id = append_within(KEYS[3], ARGV[2], ARGV[5], 6)
if record then
  if record.reclaimed then
    -- the claims that counted a possible send-window duplicate: the earlier attempts appended nothing
    redis.call('HINCRBY', KEYS[5], 'send_window_duplicates', -record.reclaimed)
    record.reclaimed = nil
  end
  record.state = 'sent'
  record.platform_ids = {id}
  record.parts = 1
  record.at = tonumber(ARGV[4])
  redis.call('HSET', KEYS[4], ARGV[3], cjson.encode(record))
end
return id
