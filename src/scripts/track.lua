-- docs/design.md §14 (task records), prepended to every script that writes
-- one. A record is the hash `{N/p}:task:<id>` in the task's partition, so
-- the script that moves the task writes it in the same step. Per task a
-- script does as little as it can (Redis's one thread pays for each call):
-- a running task is a field of the partition's `{N/p}:running` hash, set
-- for a whole batch in one call; the final ones' set, the channel and the
-- cancel requests are written once per script (`flush`).
--
-- The tracking block, seven values of ARGV from index `at`: the records'
-- key prefix `{N/p}:task:` ('' when the caller does not track), the expiry
-- of a record not yet final (ms), how long a final record is kept (ms), how
-- many final records the partition keeps, the partition's `{N/p}:finished`
-- set (final task ids scored by their end), the publish command ('PUBLISH';
-- 'SPUBLISH' on a Cluster) and the `{N/p}:final` channel, which hears the
-- ids of the tasks that became final (`wait` listens there).
local function tracking(at)
  if ARGV[at] == nil or ARGV[at] == '' then
    return nil
  end
  local prefix = ARGV[at]
  -- `{N/p}:task:` without `task:`: the partition's other tracking keys.
  local partition = string.sub(prefix, 1, #prefix - 5)
  return {
    prefix = prefix, stale = ARGV[at + 1], keep = ARGV[at + 2],
    count = tonumber(ARGV[at + 3]), finished = ARGV[at + 4],
    publish = ARGV[at + 5], channel = ARGV[at + 6],
    running = partition .. 'running', cancels = partition .. 'cancel_requests',
    ended = {}, forget = {}, asked = nil,
  }
end

local now_cached = nil
-- Redis's clock, Unix ms: records are stamped by one clock, whoever writes.
local function now_ms()
  if not now_cached then
    local t = redis.call('TIME')
    now_cached = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_cached
end

local FINAL = { succeeded = true, dead = true, cancelled = true }

-- Calls `command key <items…>` in chunks: Lua unpacks at most a few
-- thousand values at once.
local function chunked(command, key, items)
  for i = 1, #items, 1000 do
    redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
end

-- Whether task `id` has a cancel request: the partition's `{N/p}:cancel_requests`
-- (task id scored by the request's time) is looked at once per script,
-- and per task only when it is not empty (the common case costs one
-- ZCARD per script).
local function asked(t, id)
  if t.asked == nil then
    t.asked = redis.call('ZCARD', t.cancels) > 0
  end
  return t.asked and redis.call('ZSCORE', t.cancels, id) ~= false
end

-- A state that is not final, with its fields; the record expires if
-- nothing writes it again for the stale time. It no longer runs.
local function set_state(t, id, key, state, ...)
  redis.call('HSET', key, 'state', state, ...)
  redis.call('PEXPIRE', key, t.stale)
  redis.call('HDEL', t.running, id)
end

-- A final state: the record is kept for the keep time; the task joins the
-- finished set, leaves the running hash and the cancel requests, and is
-- announced, all at `flush`. What it ran as (`running`, its running hash
-- value if it has one: `instance|token|attempt|started_at`) is kept in the
-- record as it is, as its `ran` field (readers split it).
local function finish(t, id, key, state, running, ...)
  if running then
    redis.call('HSET', key, 'state', state, 'finished_at', now_ms(), 'ran', running, ...)
  else
    redis.call('HSET', key, 'state', state, 'finished_at', now_ms(), ...)
  end
  redis.call('PEXPIRE', key, t.keep)
  t.ended[#t.ended + 1] = id
end

-- The script's ends, written once: the finished set (its members older
-- than the keep time, and the oldest beyond the count, go with their
-- records, a bounded number per call), the running hash, the cancel
-- requests acted on, one message on the final channel.
local function flush(t)
  if not t then
    return
  end
  chunked('ZREM', t.cancels, t.forget)
  if #t.ended == 0 then
    return
  end
  local now = now_ms()
  local scored = {}
  for _, id in ipairs(t.ended) do
    scored[#scored + 1] = now
    scored[#scored + 1] = id
  end
  chunked('ZADD', t.finished, scored)
  redis.call('ZREMRANGEBYSCORE', t.finished, '-inf', now - tonumber(t.keep))
  local over = redis.call('ZCARD', t.finished) - t.count
  if over > 0 then
    local old = redis.call('ZPOPMIN', t.finished, math.min(over, #t.ended + 8))
    local keys = {}
    for i = 1, #old, 2 do
      keys[#keys + 1] = t.prefix .. old[i]
    end
    for i = 1, #keys, 1000 do
      redis.call('DEL', unpack(keys, i, math.min(i + 999, #keys)))
    end
  end
  chunked('HDEL', t.running, t.ended)
  redis.call(t.publish, t.channel, table.concat(t.ended, ' '))
end

-- A cancelled task leaves: its record says so once (a later script finds
-- it final and leaves it). `acked`: its entry leaves too (a fenced script
-- acked it), so its cancel request has done its work and goes; a cancel
-- that ends a task whose entry still waits (`cancel.lua`) keeps it, for
-- the script that will ack that entry.
local function cancelled(t, id, key, acked)
  if not FINAL[redis.call('HGET', key, 'state')] then
    finish(t, id, key, 'cancelled', redis.call('HGET', t.running, id), 'reason', 'user')
  end
  if acked then
    t.forget[#t.forget + 1] = id
  end
end

-- With tracking: task `id`'s record key, or, if a cancel request came
-- first, nil once the task ended `cancelled` (its caller then adds it
-- nowhere).
local function unless_cancelled(t, id)
  local key = t.prefix .. id
  if asked(t, id) then
    cancelled(t, id, key, true)
    return nil
  end
  return key
end
