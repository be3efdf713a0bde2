-- docs/design.md §14: a user's cancel of one task. The caller holds no
-- fencing token, so this writes only the request (the `cancel` field) and,
-- for a task that is not running, its end: the scripts that start, retry
-- or finish a task read the request, so whichever of them and this ran
-- first decides. A running task ends `cancelled` when its owner's next
-- script for it runs; the caller wakes the owner on `{N}:cancels`.
-- KEYS[1] = {N/p}:task:<id>
-- ARGV[1] = task id     ARGV[2..8] = the tracking block
-- Returns { what: 'final' (left as it was), 'cancelled' (now final),
-- 'running' (requested; its owner stops it), 'unknown' (no record: the
-- request is kept for the stale time, so the task never starts if it
-- exists), the state }.
local t = tracking(2)
local key, state, cancel = record_of(t, ARGV[1])
if state and FINAL[state] then
  return { 'final', state }
end
if not cancel then
  redis.call('HSET', key, 'cancel', now_ms())
end
if not state then
  redis.call('PEXPIRE', key, t.stale)
  return { 'unknown', '' }
end
if state == 'running' then
  return { 'running', state }
end
cancelled(t, ARGV[1], key, state)
return { 'cancelled', 'cancelled' }
