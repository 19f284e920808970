-- Shared by the approval scripts: KEYS[3] = the approval HASH, KEYS[4] = the session's pending ZSET, KEYS[5] = the
-- due ZSET, KEYS[6] = the tenant's pending ZSET; ARGV[2] = the approval id, ARGV[3] = its `<session>|<id>` member.
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Leave `pending`: the record takes `status` with who and how, drops out of every pending index, and is kept for
-- `retention_ms` from now.
local function settle_pending(status, by, via, now, retention_ms)
  redis.call('HSET', KEYS[3], 'status', status, 'decided_by', by, 'decision_via', via,
    'decided_at', string.format('%.6f', now))
  redis.call('ZREM', KEYS[4], ARGV[2])
  redis.call('ZREM', KEYS[5], ARGV[3])
  redis.call('ZREM', KEYS[6], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], retention_ms)
end
