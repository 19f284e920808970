-- Write facts a drain held back in one fenced step (format: see _facts.lua).
-- KEYS: 1 lease, 2 fenced, 3 events, 4 stats   ARGV: 1 token, 2 events maxlen, 3 facts JSON
local refused = fenced() if refused then return refused end
return write_facts(KEYS[3], ARGV[2], KEYS[4], ARGV[3])
