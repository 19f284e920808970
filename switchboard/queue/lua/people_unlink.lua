-- Unlink one principal from its person (nothing when it is not linked).
-- KEYS: 1 the tenant's principal → person hash, 2 its log stream   ARGV: 1 principal, 2 log cap, 3 event JSON template
-- (its "person":"__PERSON__" is replaced by the person's id)
-- Returns the person it belonged to, or false
local person = redis.call('HGET', KEYS[1], ARGV[1])
if not person then return false end
redis.call('HDEL', KEYS[1], ARGV[1])
-- only the person field: a principal may itself hold the text __PERSON__ (a function: no % escapes in the person)
local data = string.gsub(ARGV[3], '"person":"__PERSON__"', function() return '"person":"' .. person .. '"' end, 1)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', 'person_unlinked', 'data', data)
return person
