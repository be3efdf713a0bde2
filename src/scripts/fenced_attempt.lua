-- Ordered mode (docs/design.md §6): an entry retried in place is never
-- rewritten, so what its next owner must know of it lives in Redis, written
-- here, only while this instance is the recorded owner:
-- - its delivery count, the runs that may have started: any later delivery
--   (a re-read of the pending list, here or on the next owner) adds one, the
--   attempt that delivery runs. Written as attempt ARGV[5] starts, after a
--   failed attempt (the same count), and as a fetched entry that never
--   started is released ('unstarted': one less than now, undoing the count
--   of the read that delivered it), so an attempt above 1 still means "may
--   have run before";
-- - its failure count (ARGV[6], when given), in KEYS[3], written after a
--   failed attempt, before its backoff: only failures spend max_attempts.
--   The field goes when the entry is no longer pending (trim.lua).
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = {N/p}:failures
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = consumer
-- ARGV[4] = entry id     ARGV[5] = the delivery count, or 'unstarted'
-- ARGV[6] = the failure count ('': none)
-- ARGV[7] = a tracked task's id ('': untracked; docs/design.md §14), then
-- ARGV[8] = its state: 'retrying' (after a failed attempt, until its next
-- one) or 'running' (as the next attempt starts)     ARGV[9] = the error
-- ARGV[10] = the attempt     ARGV[11] = the backoff (ms)
-- ARGV[12] = what the attempt runs as ('running': its `{N/p}:running`
-- value, `instance|token|attempt|started_at`, the instance's clock)
-- ARGV[13..19] = the tracking block (track.lua)
-- Returns 1 when recorded, 0 when the entry is not pending, -1 when fenced,
-- 2 when recorded but a user's cancel request came first (the task must
-- not run again: the caller acks it, and the ack ends it `cancelled`).
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local count = ARGV[5]
if count == 'unstarted' then
  local pending = redis.call('XPENDING', KEYS[1], ARGV[2], ARGV[4], ARGV[4], 1)
  if #pending == 0 then
    return 0
  end
  count = math.max(pending[1][4] - 1, 0)
end
local recorded = #redis.call('XCLAIM', KEYS[1], ARGV[2], ARGV[3], 0, ARGV[4], 'RETRYCOUNT', count, 'JUSTID')
if recorded == 1 and ARGV[6] ~= '' then
  redis.call('HSET', KEYS[3], ARGV[4], ARGV[6])
end
local t = recorded == 1 and ARGV[7] ~= '' and tracking(13)
if t then
  local id = ARGV[7]
  if asked(t, id) then
    return 2
  end
  if ARGV[8] == 'retrying' then
    set_state(t, id, 'retrying', 'a', ARGV[10], 'e', ARGV[9],
      'd', now_ms() + tonumber(ARGV[11]))
  else
    redis.call('HSET', t.running, id, ARGV[12])
  end
end
return recorded
