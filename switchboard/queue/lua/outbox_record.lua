-- Record the outcome of a send: the 'sent' record, or '' to drop a claim whose send failed cleanly.
-- Parts an attempt already delivered (outbox_part.lua) are never forgotten: a record that is not 'sent' keeps
-- them, and a claim holding some is kept as 'failed' rather than dropped, so a retry resumes after them.
-- KEYS: 1 lease, 2 fenced, 3 outbox   ARGV: 1 token, 2 idempotency key, 3 record JSON or ''
local refused = fenced() if refused then return refused end
local cur = redis.call('HGET', KEYS[3], ARGV[2])
local progress = cur and cjson.decode(cur).progress or nil
local kept = type(progress) == 'table' and #progress > 0
if ARGV[3] == '' then
  if not kept then return redis.call('HDEL', KEYS[3], ARGV[2]) end
  local record = cjson.decode(cur)
  record.state = 'failed'
  return redis.call('HSET', KEYS[3], ARGV[2], cjson.encode(record))
end
local record = cjson.decode(ARGV[3])
if kept and record.state ~= 'sent' then
  record.progress = progress
  return redis.call('HSET', KEYS[3], ARGV[2], cjson.encode(record))
end
return redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
