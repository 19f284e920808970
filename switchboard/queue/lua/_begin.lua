-- Shared by begin and complete (which starts the drain's next attempt in the same step when asked): start an attempt
-- on the inbox head. The attempt is counted first (a SIGKILL still counts) and run_started logged; past the most
-- attempts it is only marked dead (the drain dead-letters it). Every busy policy but sequential folds what is waiting
-- (up to a.max_collect) into the turn: collect, and interrupt and steer, whose next turn takes everything waiting
-- too. The head's fields in the attempts hash also say how often its turn was interrupted and how many inbox entries
-- its last run took (steered messages included; see steer.lua). An attempt that runs also reads the session's
-- history and slots, which only the lease's holder writes, and what every turn asks before the model (operator
-- control, pending approvals), so the turn need not ask for them again.
-- k: {inbox, messages, attempts, meta, events, drain, history, slots, epoch, outbox, dead, web, control, approvals}
-- a: {max_collect, max_attempts, events_maxlen, epoch, worker, now (s), read_history ('' = neither history nor
--     slots), new_epoch (this step created the epoch counter)}
-- Returns {attempt, dead (0|1), last error, policy, interrupts, took, epoch, idle ttl, n, ids.., jsons..} followed,
-- when read, by {history entries}, {slot name, value, ...}, the operator control record ('' = none) and the number
-- of pending approvals.
local function start_attempt(k, a, head)
  local meta = redis.call('HMGET', k.meta, 'busy_policy', 'idle_ttl', 'retained_at')
  local policy = meta[1] or 'sequential'
  local ids = {head}
  if policy ~= 'sequential' then ids = redis.call('LRANGE', k.inbox, 0, tonumber(a.max_collect) - 1) end
  local attempt = redis.call('HINCRBY', k.attempts, head, 1)
  local fields = redis.call('HMGET', k.attempts, head .. ':error', head .. ':interrupts', head .. ':took')
  local dead = 0
  if attempt > tonumber(a.max_attempts) then
    dead = 1
  else
    local event = cjson.encode({kind = 'run_started', at = tonumber(a.now), message_id = head,
                                attempt = attempt, epoch = a.epoch, worker = a.worker})
    redis.call('XADD', k.events, 'MAXLEN', '~', a.events_maxlen, '*', 'kind', 'run_started', 'data', event)
  end
  -- a web chat session's keys get the idle TTL (and its slack) again when the last refresh is older than the slack
  -- (see _retention.lua), and an epoch counter this step created gets it at once
  local ttl, retained_at = meta[2], meta[3]
  local now_ms = math.floor(tonumber(a.now) * 1000)
  local status = dead == 0 and {'status', 'running'} or {}
  if ttl and ttl ~= '0' and (not retained_at or now_ms - tonumber(retained_at) >= retain_slack_ms(ttl)) then
    local kept = {k.inbox, k.messages, k.attempts, k.meta, k.events, k.drain, k.history, k.slots, k.epoch,
                  k.outbox, k.dead, k.web}
    retain_for(kept, 1, #kept, ttl)
    status[#status + 1] = 'retained_at'
    status[#status + 1] = tostring(now_ms)
  elseif ttl and a.new_epoch then
    retain_for({k.epoch}, 1, 1, ttl)
  end
  if #status > 0 then redis.call('HSET', k.meta, unpack(status)) end
  local bodies = redis.call('HMGET', k.messages, unpack(ids))
  local out = {attempt, dead, fields[1] or '', policy, tonumber(fields[2] or '0'), tonumber(fields[3] or '0'),
               string.format('%d', a.epoch), ttl or '', #ids}
  for i = 1, #ids do out[#out + 1] = ids[i] end
  for i = 1, #ids do out[#out + 1] = bodies[i] or '' end
  if dead == 0 and a.read_history ~= '' and tonumber(a.read_history) > 0 then
    out[#out + 1] = redis.call('LRANGE', k.history, -tonumber(a.read_history), -1)
    out[#out + 1] = redis.call('HGETALL', k.slots)
    out[#out + 1] = redis.call('GET', k.control) or ''
    out[#out + 1] = redis.call('ZCARD', k.approvals)
  end
  return out
end
