-- Hand kept group context to an answered message while the lease is ours: its record is rewritten with the context in
-- it, so a retried attempt reads the same. KEYS: 1 lease, 2 fenced, 3 messages hash. ARGV: 1 token, 2 message id,
-- 3 new body. Returns 1 when rewritten, 0 when the record is gone.
local refused = fenced() if refused then return refused end
if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 0 then
  return 0
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return 1
