-- Give the lease up mid-drain (shutdown): the run did not finish, so its attempt is handed back.
-- KEYS: 1 lease, 2 attempts   ARGV: 1 token, 2 message id whose attempt is returned ('' = none)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' and tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0') > 0 then
  redis.call('HINCRBY', KEYS[2], ARGV[2], -1)
end
return 1
