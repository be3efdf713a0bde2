-- docs/design.md §6 and §4 rule 8: a failed attempt's retry, written with the
-- ack of the failed entry, only while this instance is the partition's
-- recorded owner. With a delay the next attempt waits in the partition's
-- delayed set (scored by Redis's clock, so instance clocks do not matter);
-- the partition's owner moves it into the stream when due. A tracked task
-- (docs/design.md §14) is written `retrying` (or `waiting`, after an
-- interrupted run) with its next attempt and due time, or, if a cancel
-- request came first, `cancelled` and not enqueued again.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = {N/p}:delayed
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = entry id
-- ARGV[4] = delay (ms)     ARGV[5] = task id ('': untracked)
-- ARGV[6] = the state it waits in     ARGV[7] = (unused: a reason)
-- ARGV[8] = the error     ARGV[9] = the next attempt
-- ARGV[10..16] = the tracking block
-- ARGV[17..] = the next attempt's field, value, ...
-- A unique task's lock (docs/design.md §16; its key is the next attempt's
-- `unique` field) follows the next attempt, or is freed with its cancel.
-- A batch member (its `batch` field, §19) cancelled here gets its
-- completion record.
-- Returns 1 when retried (or cancelled), 0 when the entry was no longer
-- pending (a call repeated after a lost reply: nothing is added twice), -1
-- when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local acked = redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
if acked == 0 then
  return 0
end
local unique = field_of(17, 'unique')
local locks = locks_of(KEYS[1])
local task = unique and field_of(17, 'id')
local t = ARGV[5] ~= '' and tracking(10)
if t and not unless_cancelled(t, ARGV[5]) then
  release(locks, unique, task)
  completed(KEYS[1], field_of(17, 'batch'), field_of(17, 'id'), 'cancelled')
  flush(t)
  return 1
end
local delay = tonumber(ARGV[4])
local due = now_ms() + delay
if delay <= 0 then
  -- A sealed partition (a reshard, docs/design.md §21) parks it, due now.
  relocate(locks, unique, task, readd(KEYS[1], 17))
else
  local fields = {}
  for i = 17, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('ZADD', KEYS[3], due, cmsgpack.pack(fields))
  relocate(locks, unique, task, 'd:' .. due)
end
if t then
  set_state(t, ARGV[5], ARGV[6], 'a', ARGV[9], 'd', due, 'e', ARGV[8])
end
return 1
