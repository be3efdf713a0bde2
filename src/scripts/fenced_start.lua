-- docs/design.md §14: the tasks of a batch start, only while this instance
-- is the partition's recorded owner: each tracked task runs here now, as
-- one field per task of `{N/p}:running` (`instance|token|attempt|start`,
-- written by the instance), all set in one call. A task with a cancel
-- request does not start: its entry is acked and its record says
-- `cancelled` (if it did not already), in this step.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group
-- ARGV[3..9] = the tracking block (track.lua)
-- ARGV[10] = n, the tasks' count, then n pairs of task id and running
-- value, then m, 0 or n, and m stream ids of the tasks, in the same order.
-- The stream ids are read only for a task with a cancel request, so the
-- common call sends none (m = 0): a task found with a request is then not
-- started and nothing is written for it, and its id is in the reply, for
-- the caller to send again with its stream id (m = n), which ends it.
-- A unique task that does not start frees its key (docs/design.md §16),
-- and a batch member gets its completion record (§19), both read from its
-- entry: only on this path, which costs one read per task.
-- Returns, with m = n, the stream ids of the tasks that must not run
-- (cancelled); with m = 0, the task ids of those to send again; -1 when
-- fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local t = tracking(3)
local n = tonumber(ARGV[10])
-- The running hash is always a hash table (its field '', track.lua's
-- PAD): in a listpack each of a batch's fields would be found by a scan of
-- the others, and the batch's start and end would cost Redis time in the
-- square of its size.
if redis.call('ZCARD', t.cancels) == 0 then
  -- No cancel request in the partition: every task starts, in one call.
  for i = 11, 10 + 2 * n, 1000 do
    redis.call('HSET', t.running, '', PAD, unpack(ARGV, i, math.min(i + 999, 10 + 2 * n)))
  end
  return {}
end
t.asked = true
local m = tonumber(ARGV[11 + 2 * n])
local skip = {}
local running = { '', PAD }
for k = 1, n do
  local id = ARGV[9 + 2 * k]
  local stream_id = ARGV[11 + 2 * n + k]
  if not asked(t, id) then
    running[#running + 1] = id
    running[#running + 1] = ARGV[10 + 2 * k]
  elseif m == 0 then
    skip[#skip + 1] = id
  else
    local entry = redis.call('XRANGE', KEYS[1], stream_id, stream_id)[1]
    local acked = redis.call('XACK', KEYS[1], ARGV[2], stream_id)
    if entry then
      local task = field_in(entry[2], 'id')
      release(locks_of(KEYS[1]), field_in(entry[2], 'unique'), task)
      if acked == 1 then
        completed(KEYS[1], field_in(entry[2], 'batch'), task, 'cancelled')
      end
    end
    cancelled(t, id, true)
    skip[#skip + 1] = stream_id
  end
end
chunked('HSET', t.running, running)
flush(t)
return skip
