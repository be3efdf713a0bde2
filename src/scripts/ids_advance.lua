-- MajorityIds (docs/design.md §13): raise one server's copy of a sequence to
-- a proposed ID, if it is lower. Values only ever move forward.
-- KEYS[1] = peerq:ids:<key>    ARGV[1] = the proposed ID (decimal, no leading zeros)
-- ARGV[2] = 'next': a missing key stays missing (a server that lost the
--           sequence must not vote until it is repaired);
--           'repair': a missing key is created at ARGV[1].
-- Returns {1}: set; {0}: the key is missing (and left so); {2, current}:
-- the stored value is already at least ARGV[1] (returned as a string).
--
-- Values compare as decimal strings, by length then digit by digit: Lua's
-- numbers are doubles, exact only up to 2^53, and string `<` follows the
-- locale's collation.
local function less(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end

local current = redis.call('GET', KEYS[1])
if not current then
  if ARGV[2] == 'repair' then
    redis.call('SET', KEYS[1], ARGV[1])
    return {1}
  end
  return {0}
end
if less(current, ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return {1}
end
return {2, current}
