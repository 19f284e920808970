-- Record one more part of a multi-part send as delivered, so a retry (on any worker) resumes at the next part.
-- KEYS: 1 lease, 2 fenced, 3 outbox   ARGV: 1 token, 2 idempotency key, 3 the part's platform id
-- Returns how many parts the record now holds (0: no such claim, nothing written).
local refused = fenced() if refused then return refused end
local cur = redis.call('HGET', KEYS[3], ARGV[2])
if not cur then return 0 end
local record = cjson.decode(cur)
local progress = type(record.progress) == 'table' and record.progress or {}
progress[#progress + 1] = ARGV[3]
record.progress = progress
redis.call('HSET', KEYS[3], ARGV[2], cjson.encode(record))
return #progress
