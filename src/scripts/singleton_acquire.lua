-- Singletons (docs/design.md §20): record this instance as the holder of
-- singleton NAME with its fencing token (the epoch it acquired in), and
-- since when (Redis TIME, ms). Tokens only increase, as acquire.lua's do
-- for a partition: a token not above the recorded one is refused.
-- KEYS[1] = {N}:singletons     ARGV[1] = name     ARGV[2] = token
-- ARGV[3] = instance id
-- Returns 1 when recorded, else the recorded token (negated).
local recorded = redis.call('HGET', KEYS[1], ARGV[1])
local record = ARGV[2] .. ':' .. ARGV[3]
-- Already recorded by this very call (a retry after a lost reply).
if recorded == record then
  return 1
end
local token = tonumber(ARGV[2])
if recorded then
  local current = tonumber(string.match(recorded, '^(%d+):'))
  if current and current >= token then
    return -current
  end
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], record, ARGV[1] .. ':since', ms)
return 1
