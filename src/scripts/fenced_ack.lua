-- Rule 8: acknowledge entries only while this instance is the partition's
-- recorded owner with this token; a stale owner learns it is fenced.
-- Tracked tasks (docs/design.md §14) are written `succeeded`, with their
-- results, or `cancelled` if a cancel request came first, only if this
-- call acked them (so no longer pending): when one `XACK` of them all acks
-- fewer than it was given (a call sent again after a lost reply), only
-- the tasks whose records are not final yet are written.
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
for i = 4, 3 + n, 1000 do
  acked = acked + redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, i, math.min(i + 999, 3 + n)))
end
local t = tracking(4 + n)
if t then
  local first = 11 + n
  local streams, tasks = {}, {}
  for i = first, #ARGV, 3 do
    streams[#streams + 1] = ARGV[i]
    tasks[#tasks + 1] = ARGV[i + 1]
  end
  local all = 0
  for i = 1, #streams, 1000 do
    all = all + redis.call('XACK', KEYS[1], ARGV[2], unpack(streams, i, math.min(i + 999, #streams)))
  end
  local ran = {}
  for i = 1, #tasks, 1000 do
    local part = redis.call('HMGET', t.running, unpack(tasks, i, math.min(i + 999, #tasks)))
    for _, value in ipairs(part) do ran[#ran + 1] = value end
  end
  for k, id in ipairs(tasks) do
    local key = t.prefix .. id
    if all == #tasks or not FINAL[redis.call('HGET', key, 'state')] then
      local result = ARGV[first + 3 * (k - 1) + 2]
      if asked(t, id) then
        cancelled(t, id, key, true)
      elseif result ~= '' then
        finish(t, id, key, 'succeeded', ran[k], 'result', result)
      else
        finish(t, id, key, 'succeeded', ran[k])
      end
    end
  end
  acked = acked + all
  flush(t)
end
return acked
