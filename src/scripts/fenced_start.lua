-- docs/design.md §14: the tasks of a batch start, only while this instance
-- is the partition's recorded owner: each tracked task runs here now, as
-- one field per task of `{N/p}:running` (`instance|token|attempt|start`),
-- all set in one call. A task with a cancel request does not start: its
-- entry is acked and its record says `cancelled` (if it did not already),
-- in this step.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group
-- ARGV[3] = instance id     ARGV[4] = token
-- ARGV[5..11] = the tracking block (track.lua)
-- ARGV[12..] = stream id, task id, attempt, ... of each task
-- Returns the stream ids of the tasks that must not run (cancelled), or -1
-- when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local t = tracking(5)
local skip = {}
local running = {}
local as = ARGV[3] .. '|' .. ARGV[4] .. '|'
local since = '|' .. now_ms()
for i = 12, #ARGV, 3 do
  local id = ARGV[i + 1]
  if asked(t, id) then
    redis.call('XACK', KEYS[1], ARGV[2], ARGV[i])
    cancelled(t, id, t.prefix .. id, true)
    skip[#skip + 1] = ARGV[i]
  else
    running[#running + 1] = id
    running[#running + 1] = as .. ARGV[i + 2] .. since
  end
end
chunked('HSET', t.running, running)
flush(t)
return skip
