-- Retention of a web chat session's keys (docs/ARCHITECTURE.md §5): each activity (a message in, a turn begun, the
-- drain released) gives every key of the session the idle TTL again, so they all expire together once the session
-- has been idle that long, and never while it is active (the TTL is days; leases and retries take seconds).
-- ttl: '' or nil = the session has no idle TTL (platform sessions: untouched), '0' = keep forever, n = n seconds.
local function retain(keys, first, last, ttl)
  if ttl == nil or ttl == false or ttl == '' then return end
  ttl = tonumber(ttl)
  for i = first, last do
    if ttl > 0 then redis.call('EXPIRE', keys[i], ttl) else redis.call('PERSIST', keys[i]) end
  end
end

-- Keep a web stream under max_bytes (0 = no bound) besides its entry cap: after an entry of `size` bytes, when that
-- entry alone could take the stream over (size * maxlen >= max_bytes: smaller ones are bounded by the entry cap),
-- the oldest entries are trimmed until the stream's memory is within the budget.
local function trim_bytes(key, max_bytes, maxlen, size)
  max_bytes = tonumber(max_bytes)
  if max_bytes <= 0 or size * tonumber(maxlen) < max_bytes then return end
  for _ = 1, 8 do
    local used = redis.call('MEMORY', 'USAGE', key, 'SAMPLES', 0)
    if not used or used <= max_bytes then return end
    local n = redis.call('XLEN', key)
    if n <= 1 then return end
    local keep = math.min(n - 1, math.floor(n * max_bytes / used))
    redis.call('XTRIM', key, 'MAXLEN', keep)
  end
end

-- XADD the field/value pairs ARGV[first..] to `key` (entry cap `maxlen`), then keep it within `max_bytes`.
local function append_within(key, maxlen, max_bytes, first)
  local args = {'XADD', key, 'MAXLEN', '~', maxlen, '*'}
  local size = 0
  for i = first, #ARGV do
    args[#args + 1] = ARGV[i]
    size = size + #ARGV[i]
  end
  local id = redis.call(unpack(args))
  trim_bytes(key, max_bytes, maxlen, size)
  return id
end
