-- Claim a send before performing it. KEYS: 1 lease, 2 fenced, 3 outbox, 4 stats, 5 events (with facts)
-- ARGV: 1 token, 2 idempotency key, 3 claimed record JSON, 4 held facts JSON (optional; the format of
--       _facts.lua), 5 events maxlen (with facts)
-- Returns {verdict, ids}: 'sent' (skip: an earlier attempt delivered it; ids = its platform ids), 'reclaimed' (an
-- earlier attempt claimed it and never recorded the result: a possible send-window duplicate) or 'new' (also after
-- a recorded clean failure); for those two, ids = the parts an earlier attempt recorded (outbox_part.lua), which
-- the new claim keeps. ids is a JSON array. Held facts are written first in every case.
local refused = fenced() if refused then return refused end
if ARGV[4] and ARGV[4] ~= '' then write_facts(KEYS[5], ARGV[5], KEYS[4], ARGV[4]) end
local function ids_of(list)
  if type(list) ~= 'table' or #list == 0 then return '[]' end
  return cjson.encode(list)
end
local cur = redis.call('HGET', KEYS[3], ARGV[2])
local verdict = 'new'
local record = cjson.decode(ARGV[3])
local progress = nil
if cur then
  local old = cjson.decode(cur)
  if old.state == 'sent' then return {'sent', ids_of(old.platform_ids)} end
  progress = old.progress
  if old.state == 'claimed' then
    redis.call('HINCRBY', KEYS[4], 'send_window_duplicates', 1)
    -- how many unresolved reclaims this record carries: outbox_append takes them back (a Redis-written send
    -- that was never recorded was never written either)
    record.reclaimed = (old.reclaimed or 0) + 1
    verdict = 'reclaimed'
  end
end
if type(progress) == 'table' and #progress > 0 then record.progress = progress end
if verdict == 'new' and not record.progress then
  redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
else
  redis.call('HSET', KEYS[3], ARGV[2], cjson.encode(record))
end
return {verdict, ids_of(progress)}
