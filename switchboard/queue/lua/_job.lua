-- Shared by the scripts that queue a drain: push a drain entry ('<session>|<job id>') on the session's shard drain
-- queue and wake that shard's worker (SPUBLISH on the shard's ready channel, in the same slot). A wake-up is at most
-- once: the workers' safety pass finds an entry whose wake-up was lost.
-- front: push at the head (a session whose drain was interrupted resumes before the sessions waiting behind it).
local function push_entry(queue_key, entry, ready, front)
  redis.call(front and 'LPUSH' or 'RPUSH', queue_key, entry)
  redis.call('SPUBLISH', ready, entry)
end
