-- Append to a stream only while the lease is ours. KEYS: 1 lease, 2 fenced, 3 stream
-- ARGV: 1 token, 2 maxlen, 3 byte budget (0 = none; see _retention.lua), 4.. field/value pairs
local refused = fenced() if refused then return refused end
return append_within(KEYS[3], ARGV[2], ARGV[3], 4)
