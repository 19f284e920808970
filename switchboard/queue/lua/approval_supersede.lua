-- A newer user message replaced a pending approval: pending → superseded. Returns 1 when it changed, else 0.
-- KEYS: 1 lease, 2 fenced, 3 approval, 4 session's pending ZSET, 5 due ZSET, 6 tenant's pending ZSET
-- ARGV: 1 token, 2 id, 3 member, 4 retention ms
local refused = fenced() if refused then return refused end
if redis.call('HGET', KEYS[3], 'status') ~= 'pending' then return 0 end
settle_pending('superseded', 'switchboard', '', server_now(), tonumber(ARGV[4]))
return 1
