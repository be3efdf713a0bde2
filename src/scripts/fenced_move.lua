-- Rule 8 (docs/design.md §4): move an entry (a dead letter, a hand-back, a
-- take-over) only while this instance is the partition's recorded owner:
-- ack it in the partition's stream and add its new form to the destination,
-- atomically. A tracked task (docs/design.md §14) is written `waiting`
-- (back in the stream) or `dead` (with its reason, error and dead letter),
-- or, if a cancel request came first, `cancelled` and not added anywhere.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = destination
-- ({N/p}:stream or {N/p}:dead)
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = entry id
-- ARGV[4] = task id ('': untracked)     ARGV[5] = 'waiting' or 'dead'
-- ARGV[6] = the reason     ARGV[7] = the error     ARGV[8] = the attempt
-- ARGV[9..15] = the tracking block     ARGV[16..] = the new entry's field,
-- value, ...
-- A unique task's lock (docs/design.md §16; its key is the new entry's
-- `unique` field) is freed with its dead letter or its cancel, and follows
-- its new entry otherwise. A batch member (its `batch` field, §19) that
-- ends here, dead or cancelled, gets its completion record.
-- Returns 1 when moved (or cancelled), 0 when the entry was no longer
-- pending (a retried call whose first reply was lost: it is not added
-- twice), -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local acked = redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
if acked == 0 then
  return 0
end
local unique = field_of(16, 'unique')
local locks = locks_of(KEYS[1])
local task = unique and field_of(16, 'id')
local t = ARGV[4] ~= '' and tracking(9)
local batch = field_of(16, 'batch')
if t and not unless_cancelled(t, ARGV[4]) then
  release(locks, unique, task)
  completed(KEYS[1], batch, field_of(16, 'id'), 'cancelled')
  flush(t)
  return 1
end
-- (The destination says which: ARGV[5] is empty for an untracked task.)
local added
if KEYS[3] ~= KEYS[1] then
  added = redis.call('XADD', KEYS[3], '*', unpack(ARGV, 16))
  release(locks, unique, task)
  completed(KEYS[1], batch, field_of(16, 'id'), 'dead')
else
  -- Back into the stream, or, sealed by a reshard (docs/design.md §21),
  -- parked in the delayed set for the move to the new layout.
  relocate(locks, unique, task, readd(KEYS[1], 16))
end
if t then
  if ARGV[5] == 'dead' then
    finish(t, ARGV[4], 'dead', redis.call('HGET', t.running, ARGV[4]),
      'a', ARGV[8], 'w', ARGV[6], 'e', ARGV[7], 'x', added)
    flush(t)
  else
    set_state(t, ARGV[4], 'waiting', 'a', ARGV[8])
  end
end
return 1
