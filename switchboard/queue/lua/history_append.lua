-- KEYS: 1 lease, 2 fenced, 3 history   ARGV: 1 token, 2 maxlen, 3.. entry JSON
local refused = fenced() if refused then return refused end
local entries = {}
for i = 3, #ARGV do entries[#entries + 1] = ARGV[i] end
if #entries > 0 then
  redis.call('RPUSH', KEYS[3], unpack(entries))
  redis.call('LTRIM', KEYS[3], -tonumber(ARGV[2]), -1)
end
return #entries
