-- Take the session lease when nobody holds it (see _lease.lua). Returns the epoch, or 0 when held.
-- KEYS: 1 lease, 2 epoch counter   ARGV: 1 worker id, 2 lease ms
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return (take_lease(KEYS[1], KEYS[2], ARGV[1], ARGV[2]))
