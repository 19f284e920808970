-- Accept one inbound message: dedup, abuse limits, append, mark runnable, log, echo, and queue a drain if none is
-- pending (its entry pushed on the session's shard drain queue, the shard's worker woken, see _job.lua).
-- KEYS: 1 dedup, 2 messages, 3 inbox, 4 meta, 5 events, 6 drain flag, 7 runnable, 8 sessions, 9 stats,
--       10 the shard's drain queue, 11 session rate meter, 12 stop request;
--       the web chat's part, passed only for it (a platform session's ingest touches none of them):
--       13 web stream, 14 attempts, 15 history, 16 slots, 17 outbox, 18 dead letters, 19 epoch (the rest of the
--       session's keys, which the idle TTL covers);
--       or instead, for a platform message sent in one write with the one before it in the same session and delivery:
--       13 that message's dedup key (it must hold a record, or nothing is written and {4, '', 0} is returned)
-- ARGV: 1 message id, 2 message JSON, 3 now ms, 4 session, 5 channel, 6 busy policy, 7 message_received JSON,
--       8 run_queued JSON, 9 job id, 10 drain entry ('<session>|<job id>'),
--       11 message_dropped JSON up to its reason ('' = a refusal writes nothing: the web chat answers 429),
--       12 stop request JSON interrupting the running turn ('' = none: not the interrupt policy, or a /stop),
--       13 dedup TTL s, 14 events maxlen (constant per process), 15 the shard's ready channel,
--       16 messages per session per minute (constant), 17 the sender meter's wait ms (sender_meter.lua took the
--       message's token before, on the sender's own slot; > 0: it refused), 18 inbox depth (0 = no limit; constant),
--       19 the stop request's TTL ms (constant), 20 the shard's stop channel;
--       the web chat's part (with KEYS 13-19): 21 echo type ('' = none), 22 echo data, 23 web stream maxlen,
--       24 queued status JSON, 25 idle TTL s of the session's keys ('' = none; see _retention.lua),
--       26 web stream byte budget (0 = none), 27 text fingerprint ('' = none)
-- Under the interrupt policy a message accepted while a turn runs asks that turn to stop (the stop request is stored
-- and the session published, as a /stop does); the message itself waits in the inbox, so nothing rides on the
-- publish: a worker that misses it finishes the turn and the message is answered by the next one.
-- The dedup record's value is the message id, or 'id:fingerprint' when ARGV[27] was given: the dedup key is then an
-- idempotency key, and reusing it for a different text is a conflict (nothing is written).
-- Returns {0, id, drain enqueued}, {1, original id, 0} for a duplicate, {2, reason, wait ms} when over a limit,
-- {3, original id, 0} for a dedup key reused with a different fingerprint, or {4, '', 0} when the message before it
-- (KEYS[13], see above) did not land: a session's later message never lands when an earlier one failed.
local web = #KEYS > 13
local fingerprint, idle_ttl = '', ''
if web then fingerprint, idle_ttl = ARGV[27], ARGV[25] end
local id = ARGV[1]
local record = id
if fingerprint ~= '' then record = id .. ':' .. fingerprint end
-- before any write: a script is not undone by an error (here a wrong type in KEYS[13]) part way through
if #KEYS == 13 and not redis.call('GET', KEYS[13]) then return {4, '', 0} end
-- The dedup record is written first (one command on the hot path): a message refused below deletes it again, and
-- nothing else sees it in between (the script is atomic).
if not redis.call('SET', KEYS[1], record, 'NX', 'EX', ARGV[13]) then
  -- before the limits: a retry of an accepted message is a duplicate, never a refusal
  local prev = redis.call('GET', KEYS[1])
  local sep = string.find(prev, ':', 1, true)
  local prev_id = prev
  if sep then
    prev_id = string.sub(prev, 1, sep - 1)
    if fingerprint ~= '' and string.sub(prev, sep + 1) ~= fingerprint then return {3, prev_id, 0} end
  end
  redis.call('HINCRBY', KEYS[9], 'deduplicated', 1)
  return {1, prev_id, 0}
end
local session_limit, sender_wait, depth = tonumber(ARGV[16]), tonumber(ARGV[17]), tonumber(ARGV[18])
local session_tat, now
if session_limit > 0 or sender_wait > 0 or depth > 0 then
  local reason, wait = nil, 0
  if depth > 0 and redis.call('LLEN', KEYS[3]) >= depth then
    reason, wait = 'inbox_full', 1000
  end
  if session_limit > 0 then
    now = limits_now()
    local w
    w, session_tat = meter_wait(redis.call('GET', KEYS[11]), session_limit, 60000, now)
    if w > 0 then reason, wait = reason or 'session_rate', math.max(wait, w) end
  end
  if sender_wait > 0 then reason, wait = reason or 'sender_rate', math.max(wait, sender_wait) end
  if reason then
    redis.call('DEL', KEYS[1])
    if ARGV[11] ~= '' then
      redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[14], '*', 'kind', 'message_dropped', 'data', ARGV[11] .. reason .. '"}')
      redis.call('HINCRBY', KEYS[9], 'messages_dropped', 1)
    end
    return {2, reason, wait}
  end
  meter_commit(KEYS[11], session_tat, now)
end
redis.call('HSET', KEYS[2], id, ARGV[2])
local depth_now = redis.call('RPUSH', KEYS[3], id)
redis.call('ZADD', KEYS[7], 'NX', ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[8], ARGV[3], ARGV[4])
local meta = {'channel', ARGV[5], 'last_at', ARGV[3], 'busy_policy', ARGV[6]}
if redis.call('HINCRBY', KEYS[4], 'received', 1) == 1 then  -- the session's first message (or first since it expired)
  meta[#meta + 1] = 'created_at'
  meta[#meta + 1] = ARGV[3]
end
-- Retention (web chat only, see _retention.lua): the idle TTL of every key of the session is refreshed when the
-- last refresh is older than its slack (or the TTL changed), the keys this message created get it at once.
local refresh = false
if idle_ttl ~= '' then
  refresh = retain_due(KEYS[4], idle_ttl, tonumber(ARGV[3]))
  meta[#meta + 1] = 'idle_ttl'
  meta[#meta + 1] = idle_ttl
  if refresh then
    meta[#meta + 1] = 'retained_at'
    meta[#meta + 1] = ARGV[3]
  end
end
redis.call('HSET', KEYS[4], unpack(meta))
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[14], '*', 'kind', 'message_received', 'data', ARGV[7])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[14], '*', 'kind', 'run_queued', 'data', ARGV[8])
if web and ARGV[21] ~= '' then
  redis.call('XADD', KEYS[13], 'MAXLEN', '~', ARGV[23], '*', 'type', ARGV[21], 'data', ARGV[22])
  redis.call('XADD', KEYS[13], 'MAXLEN', '~', ARGV[23], '*', 'type', 'status', 'data', ARGV[24])
  trim_bytes(KEYS[13], ARGV[26], ARGV[23], #ARGV[22])
end
redis.call('HINCRBY', KEYS[9], 'accepted', 1)
if ARGV[12] ~= '' and redis.call('HGET', KEYS[4], 'status') == 'running' then
  redis.call('SET', KEYS[12], ARGV[12], 'PX', ARGV[19])
  redis.call('SPUBLISH', ARGV[20], ARGV[4])
end
local drain = 0
if redis.call('SET', KEYS[6], ARGV[9], 'NX') then
  push_entry(KEYS[10], ARGV[10], ARGV[15])
  drain = 1
end
if refresh then
  retain_for(KEYS, 2, 6, idle_ttl)
  retain_for(KEYS, 13, 19, idle_ttl)
elseif idle_ttl ~= '' and idle_ttl ~= '0' then
  -- the keys this message created since the last refresh: an emptied inbox (and its messages hash), the drain flag
  if depth_now == 1 then retain_for(KEYS, 2, 3, idle_ttl) end
  if drain == 1 then retain_for(KEYS, 6, 6, idle_ttl) end
end
return {0, id, drain}
