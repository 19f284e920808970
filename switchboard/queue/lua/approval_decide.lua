-- Apply one decision to a pending approval: one compare-and-set on `pending`, on the server's clock (TIME).
-- KEYS: 1 lease, 2 fenced, 3 approval, 4 session's pending ZSET, 5 due ZSET, 6 tenant's pending ZSET
-- ARGV: 1 token, 2 id, 3 member, 4 verdict (approve|deny|expire), 5 actor, 6 via, 7 action prefix or '',
--       8 retention ms, 9 the deciding run or '' (kept as `decided_in`: a re-run of its turn carries the decision on)
-- Returns {result, HGETALL of the approval} (just {'not_found'} when there is none).
local refused = fenced() if refused then return refused end
if redis.call('EXISTS', KEYS[3]) == 0 then return {'not_found'} end
if redis.call('HGET', KEYS[3], 'status') ~= 'pending' then
  return {'already_decided', redis.call('HGETALL', KEYS[3])}
end
local now = server_now()
local verdict = ARGV[4]
local result
if now >= tonumber(redis.call('HGET', KEYS[3], 'expires_at')) then
  -- too late for any verdict: the approval is recorded as expired (the gateway's decision, not the caller's)
  settle_pending('expired', 'switchboard', 'expiry', now, tonumber(ARGV[8]))
  if ARGV[9] ~= '' then redis.call('HSET', KEYS[3], 'decided_in', ARGV[9]) end
  if verdict == 'expire' then result = 'applied' else result = 'expired' end
elseif verdict == 'expire' then
  result = 'not_due'
else
  local prefix = ARGV[7]
  local action = redis.call('HGET', KEYS[3], 'action')
  if prefix ~= '' and string.sub(action, 1, #prefix) ~= prefix then
    result = 'mismatch'
  else
    local status = 'denied'
    if verdict == 'approve' then status = 'approved' end
    settle_pending(status, ARGV[5], ARGV[6], now, tonumber(ARGV[8]))
    if ARGV[9] ~= '' then redis.call('HSET', KEYS[3], 'decided_in', ARGV[9]) end
    result = 'applied'
  end
end
return {result, redis.call('HGETALL', KEYS[3])}
