-- docs/design.md §14: a running task's progress, written only while this
-- instance is the partition's recorded owner and `{N/p}:running` says the
-- task runs with this token (a stale owner's progress never lands).
-- KEYS[1] = {N/p}:owner     KEYS[2] = {N/p}:tasks     KEYS[3] =
-- {N/p}:running
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = token     ARGV[3] = the
-- progress     ARGV[4] = the task id
-- Returns 1 when written, 0 when the task is not running here, -1 when
-- fenced.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local running = redis.call('HGET', KEYS[3], ARGV[4])
if not running or not string.find(running, '|' .. ARGV[2] .. '|', 1, true) then
  return 0
end
append(KEYS[2], ARGV[4], cmsgpack.pack('p', ARGV[3]))
return 1
