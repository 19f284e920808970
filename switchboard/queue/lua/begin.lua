-- Start an attempt on the inbox head: count the attempt first (a SIGKILL still counts), log run_started.
-- A drain's first begin also takes the lease (lease_acquire.lua's rules: a held lease means another worker drains
-- the session); every later one is fenced by it.
-- An empty inbox ends the drain in the same step (release without stranding, see _release.lua; a first begin then
-- takes no lease at all). An attempt that runs also reads the session's history and slots, which only this lease's
-- holder writes, and what every turn asks before the model (operator control, pending approvals), so the turn need
-- not ask for them again.
-- Both give the session's keys its idle TTL again (see _retention.lua): a session expires only once idle that long.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts, 6 meta, 7 events, 8 drain flag, 9 runnable,
--       10 history, 11 slots, 12 epoch, 13 outbox, 14 dead letters, 15 web stream, 16 control, 17 approvals,
--       18 drain job hash, 19 RQ started registry (the job is closed on release)
-- ARGV: 1 token ('' when taking the lease), 2 max messages folded under collect, 3 max attempts, 4 events maxlen,
--       5 epoch, 6 worker, 7 now s, 8 session, 9 history entries to read ('' = neither history nor slots),
--       10 '1' = take the lease (the drain's first begin), 11 lease ms, 12 job composite ('' = no job to close)
-- Every busy policy but sequential folds what is waiting (up to ARGV[2]) into the turn: collect, and interrupt and
-- steer, whose next turn takes everything waiting too. The head's fields in the attempts hash also say how often its
-- turn was interrupted and how many inbox entries its last run took (steered messages included; see steer.lua).
-- Returns {0} when another worker holds the lease (first begin only), {} when the inbox was empty (released), else
-- {attempt, dead (0|1), last error, policy, interrupts, took, epoch, idle ttl, n, ids.., jsons..} followed, when
-- read, by {history entries}, {slot name, value, ...}, the operator control record ('' = none) and the number of
-- pending approvals.
local taking = ARGV[10] == '1'
if taking then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
else
  local refused = fenced() if refused then return refused end
end
local head = redis.call('LINDEX', KEYS[3], 0)
if not head then
  release(KEYS[1], KEYS[8], KEYS[9], ARGV[8], ARGV[12] ~= '' and KEYS[18], KEYS[19], ARGV[12])
  local ttl = redis.call('HGET', KEYS[6], 'idle_ttl')
  retain(KEYS, 3, 7, ttl)
  retain(KEYS, 10, 15, ttl)
  return {}
end
local epoch = tonumber(ARGV[5])
if taking then
  epoch = redis.call('INCR', KEYS[12])
  if epoch == 1 then  -- a new counter starts at the server's time in ms (see lease_acquire.lua)
    local t = redis.call('TIME')
    epoch = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('SET', KEYS[12], string.format('%d', epoch))
  end
  redis.call('SET', KEYS[1], string.format('%d', epoch) .. ':' .. ARGV[6], 'PX', ARGV[11])
end
local meta = redis.call('HMGET', KEYS[6], 'busy_policy', 'idle_ttl')
local policy = meta[1] or 'sequential'
local ids = {head}
if policy ~= 'sequential' then ids = redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[2]) - 1) end
local attempt = redis.call('HINCRBY', KEYS[5], head, 1)
local fields = redis.call('HMGET', KEYS[5], head .. ':error', head .. ':interrupts', head .. ':took')
local lasterr = fields[1] or ''
local dead = 0
if attempt > tonumber(ARGV[3]) then
  dead = 1
else
  local event = cjson.encode({kind = 'run_started', at = tonumber(ARGV[7]), message_id = head,
                              attempt = attempt, epoch = epoch, worker = ARGV[6]})
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'run_started', 'data', event)
  redis.call('HSET', KEYS[6], 'status', 'running')
end
retain(KEYS, 3, 8, meta[2])
retain(KEYS, 10, 15, meta[2])
local bodies = redis.call('HMGET', KEYS[4], unpack(ids))
local out = {attempt, dead, lasterr, policy, tonumber(fields[2] or '0'), tonumber(fields[3] or '0'),
             string.format('%d', epoch), meta[2] or '', #ids}
for i = 1, #ids do out[#out + 1] = ids[i] end
for i = 1, #ids do out[#out + 1] = bodies[i] or '' end
if dead == 0 and ARGV[9] ~= '' and tonumber(ARGV[9]) > 0 then
  out[#out + 1] = redis.call('LRANGE', KEYS[10], -tonumber(ARGV[9]), -1)
  out[#out + 1] = redis.call('HGETALL', KEYS[11])
  out[#out + 1] = redis.call('GET', KEYS[16]) or ''
  out[#out + 1] = redis.call('ZCARD', KEYS[17])
end
return out
