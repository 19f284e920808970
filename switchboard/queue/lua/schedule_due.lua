-- What a scheduler may claim now, by the server's clock: due occurrences and in-flight ones past their deadline.
-- KEYS: 1 due ZSET, 2 in-flight ZSET   ARGV: 1 most of each
-- Returns {now (ms), {job id, due (ms), ...}, {in-flight member, deadline (ms), ...}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[1]))
return {now, due, stale}
