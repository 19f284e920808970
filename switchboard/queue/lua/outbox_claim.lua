-- Claim a send before performing it. KEYS: 1 lease, 2 fenced, 3 outbox, 4 stats, 5 events (with facts)
-- ARGV: 1 token, 2 idempotency key, 3 claimed record JSON, 4 held facts JSON (optional; the format of
--       _facts.lua), 5 events maxlen (with facts)
-- Returns 'sent' (skip: an earlier attempt delivered it), 'reclaimed' (an earlier attempt claimed it and never
-- recorded the result: a possible send-window duplicate) or 'new' (also after a recorded clean failure). Held facts
-- are written first in every case.
local refused = fenced() if refused then return refused end
if ARGV[4] and ARGV[4] ~= '' then write_facts(KEYS[5], ARGV[5], KEYS[4], ARGV[4]) end
local cur = redis.call('HGET', KEYS[3], ARGV[2])
local verdict = 'new'
if cur then
  local state = cjson.decode(cur).state
  if state == 'sent' then return 'sent' end
  if state == 'claimed' then
    redis.call('HINCRBY', KEYS[4], 'send_window_duplicates', 1)
    -- how many unresolved reclaims this record carries: outbox_append takes them back (a Redis-written send
    -- that was never recorded was never written either)
    local record = cjson.decode(ARGV[3])
    record.reclaimed = (cjson.decode(cur).reclaimed or 0) + 1
    redis.call('HSET', KEYS[3], ARGV[2], cjson.encode(record))
    return 'reclaimed'
  end
end
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return verdict
