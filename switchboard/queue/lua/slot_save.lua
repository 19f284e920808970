-- KEYS: 1 lease, 2 fenced, 3 slots   ARGV: 1 token, 2 slot name (or 'untrusted': the marked slots), 3 value JSON
local refused = fenced() if refused then return refused end
return redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
