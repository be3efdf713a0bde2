-- Rule 2 (docs/design.md §4): mark(p) := max(mark(p), E). Marks only move forward.
-- A mark that moves also records when (Redis TIME, ms) in field `<p>:at`,
-- so the next owner can measure its handover pause (docs/design.md §7).
-- KEYS[1] = {N}:transition     ARGV[1] = partition     ARGV[2] = epoch E
-- Returns the mark after the write.
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local epoch = tonumber(ARGV[2])
if epoch > current then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[1] .. ':at', ms)
  return epoch
end
return current
