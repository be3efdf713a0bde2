-- docs/design.md §6: moves a partition's due delayed entries into its stream,
-- each exactly once (added and removed in one step).
-- KEYS[1] = {N/p}:delayed     KEYS[2] = {N/p}:stream     ARGV[1] = most to move
-- A unique task's lock (docs/design.md §16, unique.lua is prepended)
-- follows it into the stream; a member without a `unique` field costs one
-- plain search of its bytes.
-- Returns { moved, ms until the next one is due (-1: none), delayed left }.
-- sealed.lua is prepended too.
-- A partition sealed by a reshard (docs/design.md §21) promotes nothing:
-- its delayed set moves to the new layout as a whole.
if is_sealed(KEYS[2]) then
  return { 0, -1, redis.call('ZCARD', KEYS[1]) }
end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ms, 'LIMIT', 0, tonumber(ARGV[1]))
local locks = locks_of(KEYS[2])
for _, member in ipairs(due) do
  local fields = cmsgpack.unpack(member)
  local added = redis.call('XADD', KEYS[2], '*', unpack(fields))
  redis.call('ZREM', KEYS[1], member)
  if string.find(member, 'unique', 1, true) then
    relocate(locks, field_in(fields, 'unique'), field_in(fields, 'id'), 's:' .. added)
  end
end
local next = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #next == 0 then
  return { #due, -1, 0 }
end
-- The set's size keeps the delayed gauge exact without a read of its own.
return { #due, math.max(0, tonumber(next[2]) - ms), redis.call('ZCARD', KEYS[1]) }
