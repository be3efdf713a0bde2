-- Trims a partition stream's acknowledged entries, never past the oldest
-- entry still pending or not yet delivered (XTRIM would delete pending
-- entries too). First it forgets the failure counts (ordered mode,
-- fenced_attempt.lua) of entries no longer pending: acked or dead-lettered,
-- here or by an instance of an older version, which does not know them.
-- Ids are never reused in a stream, so a count left behind is never read;
-- removing it here keeps the acks free of it.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:failures
-- ARGV[1] = peerq's consumer group
-- Returns the number of entries removed.
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
local info
for _, group in ipairs(groups) do
  local fields = {}
  for i = 1, #group, 2 do fields[group[i]] = group[i + 1] end
  if fields['name'] == ARGV[1] then info = fields end
end
if not info then return 0 end
for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1) == 0 then
    redis.call('HDEL', KEYS[2], id)
  end
end
-- Another group (someone else reading the stream) has its own progress:
-- leave the stream alone rather than trim what it has not read.
if #groups ~= 1 then return 0 end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
if pending[1] > 0 then
  -- Everything older than the oldest pending entry was acknowledged.
  return redis.call('XTRIM', KEYS[1], 'MINID', pending[2])
end
-- Nothing pending: everything delivered so far was acknowledged; keep the
-- first entry after the last delivered one, and everything after it.
local next = redis.call('XRANGE', KEYS[1], '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
if #next == 0 then
  return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
end
return redis.call('XTRIM', KEYS[1], 'MINID', next[1][1])
