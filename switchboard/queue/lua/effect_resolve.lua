-- An operator resolved an effect in doubt: the entry records the resolution, and the effect record, when it is still
-- the `started` claim of the same action, becomes `done` with the operator's outcome (a re-run gets that outcome and
-- never performs the call again). Not fenced: operators act outside any drain; the compare keeps it safe.
-- KEYS: 1 tenant's doubt HASH, 2 effect   ARGV: 1 field, 2 resolved entry JSON, 3 done record JSON, 4 action hash,
--       5 ttl ms
-- Returns 0 (no such entry, or already resolved), 1 (resolved, record written), 2 (resolved, the record had moved on).
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if not entry then return 0 end
if cjson.decode(entry)['resolution'] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local found = redis.call('GET', KEYS[2])
if found then
  local record = cjson.decode(found)
  if record['status'] == 'started' and record['action_sha256'] == ARGV[4] then
    redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[5])
    return 1
  end
end
return 2
