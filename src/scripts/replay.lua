-- docs/design.md §6: replays a dead letter: enqueues the task again and removes
-- it from the partition's dead letters, in one step, so a replay repeated
-- (after a lost reply, or by two operators) enqueues it once. The letter is
-- removed only once the task is enqueued (a script that fails half-way is
-- not rolled back). A tracked task's record (docs/design.md §14), if it has
-- one, follows the new run: `waiting` at attempt 1, out of the finished
-- set, its end forgotten (its last error kept).
-- KEYS[1] = {N/p}:dead     KEYS[2] = {N/p}:stream
-- KEYS[3] = {N/p}:task:<task id>     KEYS[4] = {N/p}:finished
-- ARGV[1] = the dead letter's id     ARGV[2] = the task id ('': none)
-- ARGV[3] = a record's expiry while not final (ms)
-- ARGV[4..] = the task's field, value, ...
-- Returns 1 when replayed, 0 when it was not there (any more), -1 when it
-- has no fields to replay.
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return 0
end
if #ARGV < 5 then
  return -1
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))
redis.call('XDEL', KEYS[1], ARGV[1])
if ARGV[2] ~= '' and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HDEL', KEYS[3], 'finished_at', 'reason', 'dead_id', 'result', 'progress')
  redis.call('HSET', KEYS[3], 'state', 'waiting', 'attempt', 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
  redis.call('ZREM', KEYS[4], ARGV[2])
end
return 1
