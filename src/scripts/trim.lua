-- Trims a partition stream's acknowledged entries, never past the oldest
-- entry still pending or not yet delivered (XTRIM would delete pending
-- entries too).
-- KEYS[1] = {N/p}:stream     ARGV[1] = the consumer group
-- Returns the number of entries removed.
local last = nil
for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local info = {}
  for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
  if info['name'] == ARGV[1] then last = info['last-delivered-id'] end
end
if not last then return 0 end
local minid
local pending = redis.call('XPENDING', KEYS[1], ARGV[1])
if pending[1] > 0 then
  -- Everything older than the oldest pending entry was acknowledged.
  minid = pending[2]
else
  -- Nothing pending: everything delivered so far was acknowledged; keep
  -- what comes after the last delivered entry.
  local ms, seq = string.match(last, '^(%d+)-(%d+)$')
  minid = ms .. '-' .. (tonumber(seq) + 1)
end
return redis.call('XTRIM', KEYS[1], 'MINID', minid)
