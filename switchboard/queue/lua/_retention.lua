-- Retention of a web chat session's keys (docs/ARCHITECTURE.md §5): they all expire together once the session has
-- been idle its TTL, and never while it is active (the TTL is days; leases and retries take seconds).
-- ttl: '' or nil = the session has no idle TTL (platform sessions: untouched), '0' = keep forever, n = n seconds.

-- Cheap on most messages: a message (ingest) or a turn (_begin.lua) refreshes the TTL of every key
-- only when the last refresh (stamped in the session's meta) is older than the slack, an eighth of the TTL and at
-- most an hour, and gives the TTL plus that slack: a session's keys outlive its last activity by the idle TTL at
-- least (and by the slack at most); the keys a message creates get it at once.
local function retain_slack_ms(ttl)
  return math.min(math.floor(tonumber(ttl) * 125), 3600000)
end

-- Whether the session whose meta hash is `meta` is due a full refresh at `now_ms` (its TTL changed, or the last
-- refresh is older than the slack). `now_ms` is the web process's clock: a skew between processes delays a refresh by
-- that skew, which the TTL (days) dwarfs.
local function retain_due(meta, ttl, now_ms)
  local stamp = redis.call('HMGET', meta, 'idle_ttl', 'retained_at')
  if stamp[1] ~= ttl then return true end
  if ttl == '0' then return false end
  return not stamp[2] or now_ms - tonumber(stamp[2]) >= retain_slack_ms(ttl)
end

-- keys[first..last] get the idle TTL plus its slack ('0' = kept forever).
local function retain_for(keys, first, last, ttl)
  local ms = tonumber(ttl) * 1000
  for i = first, last do
    if ms > 0 then
      redis.call('PEXPIRE', keys[i], ms + retain_slack_ms(ttl))
    else
      redis.call('PERSIST', keys[i])
    end
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
