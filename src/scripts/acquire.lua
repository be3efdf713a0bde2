-- Rule 3 and §4 fencing: record this instance as the partition's owner with
-- its fencing token (the epoch it acquired in). Tokens only increase: an
-- acquire with a token not above the recorded one is refused.
-- KEYS[1] = {N/p}:owner     ARGV[1] = token     ARGV[2] = instance id
-- A singleton's holder (docs/design.md §20) is the same record in a field
-- of a hash, with when it was recorded (Redis TIME, ms) beside it:
-- KEYS[1] = {N}:singletons     ARGV[3] = the singleton's name (the field;
-- `<name>:since` is the time's).
-- Returns 1 when recorded, else the recorded token (negated) to say who won.
local field = ARGV[3]
local recorded
if field then
  recorded = redis.call('HGET', KEYS[1], field)
else
  recorded = redis.call('GET', KEYS[1])
end
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
if field then
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('HSET', KEYS[1], field, record, field .. ':since', ms)
else
  redis.call('SET', KEYS[1], record)
end
return 1
