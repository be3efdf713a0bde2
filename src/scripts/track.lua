-- docs/design.md §14 (task records), prepended to every script that writes
-- one. A record is the hash `{N/p}:task:<id>` in the task's partition, so
-- the script that moves the task writes it in the same step.
--
-- The tracking block, seven values of ARGV from index `at`: the records'
-- key prefix `{N/p}:task:` ('' when the caller does not track), the expiry
-- of a record not yet final (ms), how long a final record is kept (ms), how
-- many final records the partition keeps, the partition's `{N/p}:finished`
-- set (final task ids scored by their end), the publish command ('PUBLISH';
-- 'SPUBLISH' on a Cluster) and the `{N/p}:final` channel, which hears the
-- id of every task that became final (`wait` listens there).
local function tracking(at)
  if ARGV[at] == nil or ARGV[at] == '' then
    return nil
  end
  return {
    prefix = ARGV[at], stale = ARGV[at + 1], keep = ARGV[at + 2],
    count = tonumber(ARGV[at + 3]), finished = ARGV[at + 4],
    publish = ARGV[at + 5], channel = ARGV[at + 6],
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

-- Task `id`'s record key, its state (false: no record) and its cancel
-- request (false: none).
local function record_of(t, id)
  local key = t.prefix .. id
  local r = redis.call('HMGET', key, 'state', 'cancel')
  return key, r[1], r[2]
end

-- A state that is not final, with its fields; the record expires if
-- nothing writes it again for the stale time.
local function set_state(t, key, state, ...)
  redis.call('HSET', key, 'state', state, ...)
  redis.call('PEXPIRE', key, t.stale)
end

-- A final state: kept for the keep time, counted in the partition's
-- finished set (the oldest beyond the count go, a few per call, so a
-- script's work stays bounded), and announced on the final channel.
local function finish(t, id, key, state, ...)
  local now = now_ms()
  redis.call('HSET', key, 'state', state, 'finished_at', now, ...)
  redis.call('PEXPIRE', key, t.keep)
  redis.call('ZADD', t.finished, now, id)
  redis.call('ZREMRANGEBYSCORE', t.finished, '-inf', now - tonumber(t.keep))
  local over = redis.call('ZCARD', t.finished) - t.count
  if over > 0 then
    local old = redis.call('ZPOPMIN', t.finished, math.min(over, 8))
    for i = 1, #old, 2 do
      redis.call('DEL', t.prefix .. old[i])
    end
  end
  redis.call(t.publish, t.channel, id)
end

-- A cancelled task leaves: its record says so once (a later script finds
-- it final and leaves it).
local function cancelled(t, id, key, state)
  if not FINAL[state] then
    finish(t, id, key, 'cancelled', 'reason', 'user')
  end
end

-- With tracking: task `id`'s record key, or, if a cancel request came
-- first, nil once the task ended `cancelled` (its caller then adds it
-- nowhere).
local function unless_cancelled(t, id)
  local key, state, cancel = record_of(t, id)
  if cancel then
    cancelled(t, id, key, state)
    return nil
  end
  return key
end
