-- Shared by begin and complete: end a drain whose inbox is empty. The lease and the drain flag go (a message that
-- lands later finds no flag and queues a new drain), the session is no longer runnable, and the drain's entry leaves
-- its shard's running set in the same step. entry '' = no entry to close (a drain run outside the worker's queue).
-- close_job is also what a yielding step does to its entry.
local function close_job(wip_key, entry)
  if entry and entry ~= '' then redis.call('ZREM', wip_key, entry) end
end

local function release(lease_key, drain_key, runnable_key, session, wip_key, entry)
  redis.call('DEL', lease_key, drain_key)
  redis.call('ZREM', runnable_key, session)
  close_job(wip_key, entry)
end
