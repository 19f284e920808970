-- Consume an approved approval once: approved → executed | refused, with its outcome. Returns 1 when this call
-- consumed it, else 0.
-- KEYS: 1 lease, 2 fenced, 3 approval   ARGV: 1 token, 2 status, 3 outcome JSON or '', 4 retention ms
local refused = fenced() if refused then return refused end
if redis.call('HGET', KEYS[3], 'status') ~= 'approved' then return 0 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[3], 'status', ARGV[2], 'outcome', ARGV[3],
  'settled_at', string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1000000))
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[4]))
return 1
