-- Route an effect in doubt (claimed `started`, no recorded result) to reconciliation: one entry in the tenant's index.
-- The effect record itself stays `started`, so the call is never performed again automatically.
-- KEYS: 1 lease, 2 fenced, 3 tenant's doubt HASH   ARGV: 1 token, 2 field `<session>|<key>`, 3 entry JSON
-- Returns 1 when the entry is new, 0 when the effect was already waiting (the first entry is kept).
local refused = fenced() if refused then return refused end
return redis.call('HSETNX', KEYS[3], ARGV[2], ARGV[3])
