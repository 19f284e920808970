-- Persist a new pending approval and index it: the session's pending set, the expiry sweep, the tenant's console list.
-- KEYS: 1 lease, 2 fenced, 3 approval, 4 session's pending ZSET, 5 due ZSET, 6 tenant's pending ZSET
-- ARGV: 1 token, 2 id, 3 record JSON, 4 action hash, 5 requested_at, 6 expires_at, 7 member, 8 retention ms
-- The expiry is the record's window (expires_at - requested_at) measured on the server's clock (TIME), the clock every
-- decision and sweep reads: a worker whose clock is off neither expires an approval at once nor lets it outlive its
-- window. Returns 1, or 0 when the id is already taken (nothing changed: a record is never overwritten).
local refused = fenced() if refused then return refused end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local expires_at = now + math.max(tonumber(ARGV[6]) - tonumber(ARGV[5]), 0)
redis.call('HSET', KEYS[3], 'record', ARGV[3], 'status', 'pending', 'action', ARGV[4],
  'expires_at', string.format('%.17g', expires_at))
redis.call('ZADD', KEYS[4], now, ARGV[2])
redis.call('ZADD', KEYS[5], string.format('%.17g', expires_at), ARGV[7])
redis.call('ZADD', KEYS[6], now, ARGV[7])
local left_ms = math.max(math.floor((expires_at - now) * 1000), 0)
redis.call('PEXPIRE', KEYS[3], left_ms + tonumber(ARGV[8]))
return 1
