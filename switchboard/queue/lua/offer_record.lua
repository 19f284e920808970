-- KEYS: 1 lease, 2 fenced, 3 offers   ARGV: 1 token, 2 offer JSON, 3 offers kept, 4 TTL (ms)
-- The newest offer goes first; an offer already recorded (a resumed send) is not recorded twice.
local refused = fenced() if refused then return refused end
local kept = tonumber(ARGV[3])
for _, recorded in ipairs(redis.call('LRANGE', KEYS[3], 0, kept - 1)) do
  if recorded == ARGV[2] then
    redis.call('PEXPIRE', KEYS[3], ARGV[4])
    return 0
  end
end
redis.call('LPUSH', KEYS[3], ARGV[2])
redis.call('LTRIM', KEYS[3], 0, kept - 1)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return 1
