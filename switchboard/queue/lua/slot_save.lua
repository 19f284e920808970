-- Save one session-state slot. A slots hash this save creates gets the web chat session's idle TTL at once (the
-- refreshes of _begin.lua give the keys that exist theirs).
-- KEYS: 1 lease, 2 fenced, 3 slots, 4 meta   ARGV: 1 token, 2 slot name (or 'untrusted': the marked slots), 3 value JSON
local refused = fenced() if refused then return refused end
local created = redis.call('EXISTS', KEYS[3]) == 0
local n = redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
if created then
  local ttl = redis.call('HGET', KEYS[4], 'idle_ttl')
  if ttl and ttl ~= '0' then retain_for(KEYS, 3, 3, ttl) end
end
return n
