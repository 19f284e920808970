-- Replace a session's drain flag with a new drain job, unless a lease is held or the flag changed meanwhile.
-- KEYS: 1 lease, 2 drain flag, 3 the shard's drain queue, 4 the shard's running set
-- ARGV: 1 expected flag ('' = absent), 2 job id, 3 drain entry, 4 the shard's ready channel,
--       5 '1' to push at the head of the queue (a repaired or handed-over session), '' at the back,
--       6 the stale entry to drop from the running set ('' = none: the repaired drain's, whose worker is gone)
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local cur = redis.call('GET', KEYS[2]) or ''
if cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
if ARGV[6] ~= '' then redis.call('ZREM', KEYS[4], ARGV[6]) end
push_entry(KEYS[3], ARGV[3], ARGV[4], ARGV[5] == '1')
return 1
