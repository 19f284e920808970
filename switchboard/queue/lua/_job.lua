-- Shared by ingest and enqueue: write a drain job hash in rq 3's format and push its id on the queue.
-- cfg (JSON, constant per queue): {queue = rq queue key, queues = rq queues set, func = drain function,
-- fields = [field, value, ...] constant fields of a queued job}.
-- front: push at the head (a session whose drain was interrupted resumes before the sessions waiting behind it).
local function push_job(job_key, job_id, session, rq_now, cfg, front)
  local fields = {}
  for i = 1, #cfg.fields do fields[i] = cfg.fields[i] end
  local n = #fields
  fields[n + 1] = 'created_at'
  fields[n + 2] = rq_now
  fields[n + 3] = 'enqueued_at'
  fields[n + 4] = rq_now
  fields[n + 5] = 'description'
  fields[n + 6] = 'drain ' .. session
  fields[n + 7] = 'data'
  -- JSON serializer payload (func, instance, args, kwargs); RQ reads uncompressed data as is
  fields[n + 8] = '[' .. cjson.encode(cfg.func) .. ',null,[' .. cjson.encode(session) .. '],{}]'
  redis.call('HSET', job_key, unpack(fields))
  redis.call(front and 'LPUSH' or 'RPUSH', cfg.queue, job_id)
  redis.call('SADD', cfg.queues, cfg.queue)
end
