-- docs/design.md §14: the tasks of a batch start, only while this instance
-- is the partition's recorded owner: each tracked task's record says
-- `running` (instance, fencing token, attempt, start time). A task whose
-- record holds a cancel request does not start: its entry is acked and its
-- record says `cancelled` (if it did not already), in this step.
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
for i = 12, #ARGV, 3 do
  local key, state, cancel = record_of(t, ARGV[i + 1])
  if cancel then
    redis.call('XACK', KEYS[1], ARGV[2], ARGV[i])
    cancelled(t, ARGV[i + 1], key, state)
    skip[#skip + 1] = ARGV[i]
  else
    set_state(t, key, 'running', 'instance', ARGV[3], 'token', ARGV[4],
      'attempt', ARGV[i + 2], 'started_at', now_ms())
  end
end
return skip
