-- Link principals to one person, all or none: refused when one of them already belongs to another person.
-- KEYS: 1 the tenant's principal → person hash, 2 its log stream   ARGV: 1 person, 2 log cap, 3 event JSON, 4.. principals
-- Returns {0} (linked), or {1, principal, its person} (refused, nothing written)
for i = 4, #ARGV do
  local other = redis.call('HGET', KEYS[1], ARGV[i])
  if other and other ~= ARGV[1] then return {1, ARGV[i], other} end
end
for i = 4, #ARGV do redis.call('HSET', KEYS[1], ARGV[i], ARGV[1]) end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'kind', 'person_linked', 'data', ARGV[3])
return {0}
