-- docs/design.md §14: a user's cancel of one task. The caller holds no
-- fencing token, so this writes only the request (`{N/p}:cancel_requests`, and the
-- record's `cancel` time) and, for a task that is not running, its end:
-- the scripts that start, retry or finish a task read the request, so
-- whichever of them and this ran first decides. A running task ends
-- `cancelled` when its owner's next script for it runs; the caller wakes
-- the owner on `{N}:cancels`.
-- KEYS[1] = {N/p}:tasks (as the tracking block names it: a key must be
-- declared)
-- ARGV[1] = task id     ARGV[2..8] = the tracking block
-- Returns { what: 'final' (left as it was), 'cancelled' (now final),
-- 'running' (requested; its owner stops it), 'unknown' (no record: the
-- request is kept for the sweep time, so the task never starts if it
-- exists), and the final state, or for 'running' its `{N/p}:running`
-- value (`instance|token|attempt|started_at`) }.
local t = tracking(2)
local id = ARGV[1]
local record = redis.call('HGET', t.tasks, id)
local was = decoded(record)
if FINAL[was.s] then
  return { 'final', was.s }
end
local now = now_ms()
-- Requests older than the sweep time are of tasks that never existed.
redis.call('ZREMRANGEBYSCORE', t.cancels, '-inf', now - tonumber(t.stale))
redis.call('ZADD', t.cancels, 'NX', now, id)
local running = redis.call('HGET', t.running, id)
if not running and not was.s then
  return { 'unknown', '' }
end
if not was.c then
  append(t.tasks, id, cmsgpack.pack('c', now))
end
if running then
  return { 'running', running }
end
cancelled(t, id, false)
flush(t)
-- Final now, so its unique key is free at once (docs/design.md §16); its
-- entry, still waiting, is acked without running by the start that reads
-- it, whose release leaves a key a newer task took.
if was.u then
  release(string.sub(t.tasks, 1, #t.tasks - 5) .. 'unique', was.u, id)
end
return { 'cancelled', 'cancelled' }
