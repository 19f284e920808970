-- Shared by begin and complete: end a drain whose inbox is empty. The lease and the drain flag go (a message that
-- lands later finds no flag and enqueues a new drain job), the session is no longer runnable, and the drain job's
-- RQ bookkeeping is closed in the same step (a finished drain job keeps no result: deleted, as job_finish.lua does).
-- job_key '' = the caller closes its job itself. close_job is also what a yielding step does to its job.
local function close_job(job_key, started_key, composite)
  if job_key and job_key ~= '' then
    redis.call('ZREM', started_key, composite)
    redis.call('DEL', job_key)
  end
end

local function release(lease_key, drain_key, runnable_key, session, job_key, started_key, composite)
  redis.call('DEL', lease_key, drain_key)
  redis.call('ZREM', runnable_key, session)
  close_job(job_key, started_key, composite)
end
