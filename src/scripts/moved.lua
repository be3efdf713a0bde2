-- docs/design.md §21: the second step of a move, in the source partition
-- (the first is `move_in.lua`, in the destination): removes the delayed
-- task or dead letter and its task record (§14), only if the record and
-- its cancel request are still what the first step copied. A user's cancel
-- that came between the steps changed them: nothing is removed, and the
-- next look moves the task again, with its record as it is now. So the
-- destination holds the latest state whenever the source lets go, and a
-- reader that no longer finds the record here looks in the new layout.
-- Not fenced: it removes only what the destination already holds.
-- KEYS[1] = {N/p}:delayed or {N/p}:dead     KEYS[2] = {N/p}:tasks
-- KEYS[3] = {N/p}:cancel_requests
-- ARGV[1] = 'delayed' or 'dead'     ARGV[2] = the member's bytes, or the
-- letter's id     ARGV[3] = the task id     ARGV[4] = the record copied
-- ('': none)     ARGV[5] = the cancel request's time copied ('': none)
-- ARGV[6] = 'PUBLISH' or 'SPUBLISH'     ARGV[7] = {N/p}:final, where a
-- waiter of the task hears that it moved
-- Returns 1 when removed, 0 when the source changed (moved again later).
local id = ARGV[3]
if (redis.call('HGET', KEYS[2], id) or '') ~= ARGV[4]
    or (redis.call('ZSCORE', KEYS[3], id) or '') ~= ARGV[5] then
  return 0
end
if ARGV[1] == 'delayed' then
  redis.call('ZREM', KEYS[1], ARGV[2])
else
  redis.call('XDEL', KEYS[1], ARGV[2])
end
if ARGV[4] ~= '' then
  redis.call('HDEL', KEYS[2], id)
  redis.call(ARGV[6], ARGV[7], id)
end
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[3], id)
end
return 1
