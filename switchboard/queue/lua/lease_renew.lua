-- Heartbeat: extend the lease only while it is still ours. KEYS: 1 lease   ARGV: 1 token, 2 lease ms
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
