-- Start an attempt on the inbox head (see _begin.lua). A drain's first begin also takes the lease (_lease.lua; as
-- lease_acquire.lua: a held lease means another worker drains the session); every later one is fenced by it.
-- An empty inbox ends the drain in the same step (release without stranding, see _release.lua; a first begin then
-- takes no lease at all). A web chat session's keys keep their idle TTL from the last refresh (see _begin.lua): the
-- TTL and its slack cover the time since.
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts, 6 meta, 7 events, 8 drain flag, 9 runnable,
--       10 history, 11 slots, 12 epoch, 13 outbox, 14 dead letters, 15 web stream, 16 control, 17 approvals,
--       18 the shard's running set (the drain's entry leaves it on release)
-- ARGV: 1 token ('' when taking the lease), 2 max messages folded under collect, 3 max attempts, 4 events maxlen,
--       5 epoch, 6 worker, 7 now s, 8 session, 9 history entries to read ('' = neither history nor slots),
--       10 '1' = take the lease (the drain's first begin), 11 lease ms, 12 the drain's entry ('' = none to close)
-- Returns {0} when another worker holds the lease (first begin only), {} when the inbox was empty (released), else
-- the attempt (_begin.lua's layout).
local taking = ARGV[10] == '1'
if taking then
  if redis.call('EXISTS', KEYS[1]) == 1 then return {0} end
else
  local refused = fenced() if refused then return refused end
end
local head = redis.call('LINDEX', KEYS[3], 0)
if not head then
  release(KEYS[1], KEYS[8], KEYS[9], ARGV[8], KEYS[18], ARGV[12])
  return {}
end
local epoch, new_epoch = tonumber(ARGV[5]), false
if taking then epoch, new_epoch = take_lease(KEYS[1], KEYS[12], ARGV[6], ARGV[11]) end
return start_attempt(
  {inbox = KEYS[3], messages = KEYS[4], attempts = KEYS[5], meta = KEYS[6], events = KEYS[7], drain = KEYS[8],
   history = KEYS[10], slots = KEYS[11], epoch = KEYS[12], outbox = KEYS[13], dead = KEYS[14], web = KEYS[15],
   control = KEYS[16], approvals = KEYS[17]},
  {max_collect = ARGV[2], max_attempts = ARGV[3], events_maxlen = ARGV[4], epoch = epoch, worker = ARGV[6],
   now = ARGV[7], read_history = ARGV[9], new_epoch = new_epoch},
  head)
