-- Rule 8: acknowledge entries only while this instance is the partition's
-- recorded owner with this token; a stale owner learns it is fenced.
-- Tracked tasks (docs/design.md §14) are acked one by one, and only a task
-- this call acked (so no longer pending) is written `succeeded`, with its
-- result, or `cancelled` if a cancel request came first.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group
-- ARGV[3] = n, the untracked entries' count     ARGV[4..3+n] = their ids
-- then, with tracked tasks: the tracking block (track.lua), and stream id,
-- task id, result ('' for none), ... of each.
-- Returns the number acknowledged, or -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local n = tonumber(ARGV[3])
local acked = 0
if n > 0 then
  acked = redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, 4, 3 + n))
end
local t = tracking(4 + n)
if t then
  for i = 11 + n, #ARGV, 3 do
    if redis.call('XACK', KEYS[1], ARGV[2], ARGV[i]) == 1 then
      acked = acked + 1
      local key, state, cancel = record_of(t, ARGV[i + 1])
      if cancel then
        cancelled(t, ARGV[i + 1], key, state)
      elseif ARGV[i + 2] ~= '' then
        finish(t, ARGV[i + 1], key, 'succeeded', 'result', ARGV[i + 2])
      else
        finish(t, ARGV[i + 1], key, 'succeeded')
      end
    end
  end
end
return acked
