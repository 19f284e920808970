-- Append to a stream only while the lease is ours. KEYS: 1 lease, 2 fenced, 3 stream
-- ARGV: 1 token, 2 maxlen, 3 byte budget (0 = none; see _retention.lua), 4.. field/value pairs
local refused = fenced() if refused then return refused end
local args = {'XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*'}
local size = 0
for i = 4, #ARGV do
  args[#args + 1] = ARGV[i]
  size = size + #ARGV[i]
end
local id = redis.call(unpack(args))
trim_bytes(KEYS[3], ARGV[3], ARGV[2], size)
return id
