-- Claim a write effect's idempotency key, or return the record already under it.
-- KEYS: 1 lease, 2 fenced, 3 effect   ARGV: 1 token, 2 record JSON, 3 ttl ms
-- Returns the existing record (JSON), or false when the claim was taken.
local refused = fenced() if refused then return refused end
local found = redis.call('GET', KEYS[3])
if found then return found end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
return false
