-- Rule 2 (docs/design.md §4): mark(p) := max(mark(p), E). Marks only move forward.
-- KEYS[1] = {N}:transition     ARGV[1] = partition     ARGV[2] = epoch E
-- Returns the mark after the write.
local current = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local epoch = tonumber(ARGV[2])
if epoch > current then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return epoch
end
return current
