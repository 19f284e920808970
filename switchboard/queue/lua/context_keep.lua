-- Keep one unanswered group message as context (no run). KEYS: 1 context list, 2 dedup, 3 events stream
-- ARGV: 1 entry JSON, 2 max messages, 3 list TTL s, 4 dedup TTL s, 5 events maxlen, 6 event data JSON
-- Returns 1 when kept, 0 for a platform's retry of one already kept.
if not redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[4]) then
  return 0
end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'kind', 'context_kept', 'data', ARGV[6])
return 1
