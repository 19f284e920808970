-- Append to a stream only while the lease is ours. KEYS: 1 lease, 2 fenced, 3 stream
-- ARGV: 1 token, 2 maxlen, 3.. field/value pairs
local refused = fenced() if refused then return refused end
local args = {'XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*'}
for i = 3, #ARGV do args[#args + 1] = ARGV[i] end
return redis.call(unpack(args))
