-- One console sign-in try for one (client address, operator name) pair: refused while the pair waits (nothing is
-- counted), else counted before its password is checked. From the FREE-th counted try on, each makes the pair wait
-- BASE_MS * 2^(n - FREE), at most MAX_MS, before its next try: growing delays for one address guessing one name,
-- while the name stays open to every other address. The count lasts WINDOW_S after the pair's last try.
-- KEYS: 1 the pair's count, 2 its wait   ARGV: 1 free tries, 2 first wait (ms), 3 longest wait (ms), 4 window (s)
-- Returns the wait left in ms (refused) or 0 (counted: check the password)
local left = redis.call('PTTL', KEYS[2])
if left > 0 then return left end
local n = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[4])
local free = tonumber(ARGV[1])
if n >= free then
  local wait = math.min(tonumber(ARGV[2]) * 2 ^ math.min(n - free, 40), tonumber(ARGV[3]))
  if wait >= 1 then redis.call('SET', KEYS[2], '1', 'PX', math.floor(wait)) end
end
return 0
