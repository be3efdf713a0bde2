-- Records service-wide settings on first use and reports the ones that differ.
-- KEYS[1] = {N}:meta
-- ARGV    = field1, value1, field2, value2, ...
-- Returns   field, stored value pairs for every field stored with another value.
-- One script, so two instances starting at once cannot both "win" with
-- different values.
local differ = {}
for i = 1, #ARGV, 2 do
  local field, value = ARGV[i], ARGV[i + 1]
  local stored = redis.call('HGET', KEYS[1], field)
  if not stored then
    redis.call('HSET', KEYS[1], field, value)
  elseif stored ~= value then
    table.insert(differ, field)
    table.insert(differ, stored)
  end
end
return differ
