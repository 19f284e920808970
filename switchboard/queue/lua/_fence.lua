-- Shared prelude of every fenced script: KEYS[1] = session lease, KEYS[2] = the session's shard's stats hash (a
-- refusal counts in its field fenced_rejections), ARGV[1] = the caller's lease token (``<epoch>:<worker>``, or just
-- ``<epoch>:``). Epochs are unique per session (INCR), so the epoch alone identifies the lease grant.
local function fenced()
  local cur = redis.call('GET', KEYS[1])
  if (not cur) or string.match(cur, '^%d+') ~= string.match(ARGV[1], '^%d+') then
    redis.call('HINCRBY', KEYS[2], 'fenced_rejections', 1)
    return redis.error_reply('FENCED the session lease has passed to another epoch')
  end
  return nil
end
