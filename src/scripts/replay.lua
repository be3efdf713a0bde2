-- DESIGN.md §6: replays a dead letter: removes it from the partition's dead
-- letters and enqueues the task again, in one step, so a replay repeated
-- (after a lost reply, or by two operators) enqueues it once.
-- KEYS[1] = {N/p}:dead     KEYS[2] = {N/p}:stream
-- ARGV[1] = the dead letter's id     ARGV[2..] = the task's field, value, ...
-- Returns 1 when replayed, 0 when it was not there (any more).
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 2))
return 1
