-- Start an attempt on the inbox head: count the attempt first (a SIGKILL still counts), log run_started.
-- An empty inbox ends the drain in the same step (release without stranding: a message that lands later finds
-- no drain flag and enqueues a new drain job). An attempt that runs also reads the session's history and slots,
-- which only this lease's holder writes, so the turn need not ask for them again.
-- Both give the session's keys its idle TTL again (see _retention.lua): a session expires only once idle that long.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts, 6 meta, 7 events, 8 drain flag, 9 runnable,
--       10 history, 11 slots, 12 epoch, 13 outbox, 14 dead letters, 15 web stream, 16 control, 17 approvals
-- ARGV: 1 token, 2 max messages folded under collect, 3 max attempts, 4 events maxlen, 5 epoch, 6 worker, 7 now s,
--       8 session, 9 history entries to read ('' = neither history nor slots)
-- Every busy policy but sequential folds what is waiting (up to ARGV[2]) into the turn: collect, and interrupt and
-- steer, whose next turn takes everything waiting too. The head's fields in the attempts hash also say how often its
-- turn was interrupted and how many inbox entries its last run took (steered messages included; see steer.lua).
-- Returns {} when the inbox was empty (released), else {attempt, dead (0|1), last error, policy, interrupts, took, n,
-- ids.., jsons..} followed, when read, by {history entries}, {slot name, value, ...}, the operator control record
-- ('' = none) and the number of pending approvals: what every turn asks before the model, read in the same step.
local refused = fenced() if refused then return refused end
local head = redis.call('LINDEX', KEYS[3], 0)
if not head then
  redis.call('DEL', KEYS[1], KEYS[8])
  redis.call('ZREM', KEYS[9], ARGV[8])
  local ttl = redis.call('HGET', KEYS[6], 'idle_ttl')
  retain(KEYS, 3, 7, ttl)
  retain(KEYS, 10, 15, ttl)
  return {}
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
                              attempt = attempt, epoch = tonumber(ARGV[5]), worker = ARGV[6]})
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[4], '*', 'kind', 'run_started', 'data', event)
  redis.call('HSET', KEYS[6], 'status', 'running')
end
retain(KEYS, 3, 8, meta[2])
retain(KEYS, 10, 15, meta[2])
local bodies = redis.call('HMGET', KEYS[4], unpack(ids))
local out = {attempt, dead, lasterr, policy, tonumber(fields[2] or '0'), tonumber(fields[3] or '0'), #ids}
for i = 1, #ids do out[#out + 1] = ids[i] end
for i = 1, #ids do out[#out + 1] = bodies[i] or '' end
if dead == 0 and ARGV[9] ~= '' and tonumber(ARGV[9]) > 0 then
  out[#out + 1] = redis.call('LRANGE', KEYS[10], -tonumber(ARGV[9]), -1)
  out[#out + 1] = redis.call('HGETALL', KEYS[11])
  out[#out + 1] = redis.call('GET', KEYS[16]) or ''
  out[#out + 1] = redis.call('ZCARD', KEYS[17])
end
return out
