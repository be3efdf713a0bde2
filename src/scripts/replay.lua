-- docs/design.md §6: replays a dead letter: enqueues the task again and removes
-- it from the partition's dead letters, in one step, so a replay repeated
-- (after a lost reply, or by two operators) enqueues it once. The letter is
-- removed only once the task is enqueued (a script that fails half-way is
-- not rolled back).
-- KEYS[1] = {N/p}:dead     KEYS[2] = {N/p}:stream
-- ARGV[1] = the dead letter's id     ARGV[2..] = the task's field, value, ...
-- Returns 1 when replayed, 0 when it was not there (any more), -1 when it
-- has no fields to replay.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 0
end
if #ARGV < 3 then
  return -1
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
redis.call('XDEL', KEYS[1], ARGV[1])
return 1
