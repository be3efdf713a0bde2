-- Trims a partition stream's acknowledged entries, never past the oldest
-- entry still pending or not yet delivered (XTRIM would delete pending
-- entries too).
-- KEYS[1] = {N/p}:stream     ARGV[1] = peerq's consumer group
-- Returns the number of entries removed.
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
-- Another group (someone else reading the stream) has its own progress:
-- leave the stream alone rather than trim what it has not read.
if #groups ~= 1 then return 0 end
local info = {}
for i = 1, #groups[1], 2 do info[groups[1][i]] = groups[1][i + 1] end
if info['name'] ~= ARGV[1] then return 0 end
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
