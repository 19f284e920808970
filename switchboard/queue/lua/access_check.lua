-- A pairing-mode sender nothing in the configuration admits: paired already, or refused (issuing a code if it holds
-- no live one), the refusal answer rate-limited per sender. One round trip for an unknown sender.
-- KEYS: 1 the tenant's paired hash, 2 the sender's pending code, 3 the new code's record, 4 the sender's notice mark,
--       5 the tenant's open requests
-- ARGV: 1 principal, 2 new code's digest, 3 new code's record (JSON), 4 code TTL (s), 5 notice interval (s), 6 now (s)
-- Returns {1, paired record} | {2, code TTL ms, 1} (a code issued: answer with it) | {3, live code's TTL ms, answer?}
local paired = redis.call('HGET', KEYS[1], ARGV[1])
if paired then return {1, paired} end
local left = redis.call('PTTL', KEYS[2])
if left > 0 then
  local answer = redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[5])
  return {3, left, answer and 1 or 0}
end
local ttl = tonumber(ARGV[4])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ttl)
redis.call('SET', KEYS[3], ARGV[3], 'EX', ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', ARGV[6])
redis.call('ZADD', KEYS[5], tonumber(ARGV[6]) + ttl, ARGV[1])
redis.call('SET', KEYS[4], '1', 'EX', ARGV[5])
return {2, ttl * 1000, 1}
