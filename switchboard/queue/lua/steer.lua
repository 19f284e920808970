-- Hand the running turn (steer policy) the messages that arrived behind the ones it has, at its next step. Nothing is
-- acked here: the turn's complete acks them with the rest, so a worker that dies mid-turn leaves them in the inbox.
-- Only plain messages are steered, up to the first that is not one: a command, a stop, a typed approval decision, a
-- click, an edit or a deletion, or a message with attachments (those are prepared for the model when a turn starts)
-- waits for the next turn, with everything behind it. The head's ':took' field records how many inbox entries the turn has now (a resumed reply
-- acks no more than that run answered).
-- KEYS: 1 lease, 2 fenced, 3 inbox, 4 messages, 5 attempts
-- ARGV: 1 token, 2 the turn's head message id, 3 inbox entries the turn has already, 4 most it may have in all,
--       5 stop commands JSON (lower case, e.g. ["/stop"])
-- Returns {n, ids.., jsons..} (n = 0 when nothing new can be steered).
local refused = fenced() if refused then return refused end
if redis.call('LINDEX', KEYS[3], 0) ~= ARGV[2] then
  return redis.error_reply('NOTHEAD inbox head is not the running turn\'s message')
end
local from, last = tonumber(ARGV[3]), tonumber(ARGV[4]) - 1
if from > last then return {0} end
local waiting = redis.call('LRANGE', KEYS[3], from, last)
if #waiting == 0 then return {0} end
local bodies = redis.call('HMGET', KEYS[4], unpack(waiting))
local stops = {}
for _, command in ipairs(cjson.decode(ARGV[5])) do stops[command] = true end
local function plain(body)
  if not body then return false end
  local message = cjson.decode(body)
  local event = message.event
  if type(event) == 'table' then
    if event.kind ~= 'message' then return false end
    if type(event.attachments) == 'table' and next(event.attachments) ~= nil then return false end
  end
  local text = string.lower(string.match(type(message.text) == 'string' and message.text or '', '^%s*(.-)%s*$'))
  if stops[text] then return false end
  -- a typed approval decision (/approve ID, /deny ID) is applied by a turn of its own, never read as words
  for _, verb in ipairs({'/approve', '/deny'}) do
    if text == verb or string.sub(text, 1, #verb + 1) == verb .. ' ' or string.sub(text, 1, #verb + 1) == verb .. '@' then
      return false
    end
  end
  return true
end
local out = {0}
local ids = {}
for i = 1, #waiting do
  if not plain(bodies[i]) then break end
  ids[#ids + 1] = waiting[i]
end
if #ids == 0 then return {0} end
redis.call('HSET', KEYS[5], ARGV[2] .. ':took', from + #ids)
out[1] = #ids
for i = 1, #ids do out[#out + 1] = ids[i] end
for i = 1, #ids do out[#out + 1] = bodies[i] end
return out
