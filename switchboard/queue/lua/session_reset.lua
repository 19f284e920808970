-- KEYS: 1 lease, 2 fenced, 3 history, 4 slots, 5 offers   ARGV: 1 token
-- (/reset: the conversation is forgotten, and the buttons it offered are no longer answerable)
local refused = fenced() if refused then return refused end
return redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
