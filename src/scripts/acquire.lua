-- Rule 3 and §4 fencing: record this instance as the partition's owner with
-- its fencing token (the epoch it acquired in). Tokens only increase: an
-- acquire with a token not above the recorded one is refused.
-- KEYS[1] = {N/p}:owner     ARGV[1] = token     ARGV[2] = instance id
-- Returns 1 when recorded, else the recorded token (negated) to say who won.
local recorded = redis.call('GET', KEYS[1])
local record = ARGV[1] .. ':' .. ARGV[2]
-- Already recorded by this very call (a retry after a lost reply).
if recorded == record then
  return 1
end
local token = tonumber(ARGV[1])
if recorded then
  local current = tonumber(string.match(recorded, '^(%d+):'))
  if current and current >= token then
    return -current
  end
end
redis.call('SET', KEYS[1], record)
return 1
