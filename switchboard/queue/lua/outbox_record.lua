-- Record the outcome of a send: the 'sent' record, or '' to drop a claim whose send failed cleanly.
-- KEYS: 1 lease, 2 fenced, 3 outbox   ARGV: 1 token, 2 idempotency key, 3 record JSON or ''
local refused = fenced() if refused then return refused end
if ARGV[3] == '' then return redis.call('HDEL', KEYS[3], ARGV[2]) end
return redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
