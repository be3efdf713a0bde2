-- docs/design.md §14 (task records), prepended to every script that writes
-- one. The records of a partition's tasks are fields of one hash,
-- `{N/p}:tasks`: task id → its record, so the script that moves a task
-- writes its record in the same step, and a whole batch's records in one
-- call, with no key and no expiry per task (Redis 7.0 has no expiry per
-- hash field): that is what keeps a tracked task cheap for Redis's one
-- thread. A record is a run of MessagePack values, name, value, name,
-- value, … (`cmsgpack.pack`), and a writer appends what changed (a later
-- name wins when read), so no script decodes a record on the busy paths.
-- The names, one letter each (tracking/packed.rs reads the same):
--   s state     a attempt     q enqueued_at     d due_at     f finished_at
--   r ran (instance|token|attempt|started_at)   e error     w reason
--   x dead_id   p progress    v result (the value)   c cancel   t touched
--   u unique (the unique key the task holds, docs/design.md §16)
-- Final records are bounded by time and count through `{N/p}:ended` (their
-- ids, oldest first) and `{N/p}:ended_at` (`<end, Unix ms> <how many>`,
-- one item per script that ended tasks, in the same order);
-- records that never end are swept by their age (sweep.lua). A running
-- task is a field of `{N/p}:running`, set for a whole batch in one call;
-- the final records, the ended list, the channel and the cancel requests
-- are written once per script (`flush`).
--
-- The tracking block, seven values of ARGV from index `at`: the records'
-- hash `{N/p}:tasks` ('' when the caller does not track), the time after
-- which a record not yet final is swept (ms; sweep.lua), how long a final
-- record is kept (ms), how many final records the partition keeps, the
-- partition's `{N/p}:ended` list (`{N/p}:ended_at` is named after it),
-- the publish command ('PUBLISH'; 'SPUBLISH' on a Cluster) and the
-- `{N/p}:final` channel, which hears the ids of the tasks that became final
-- (`wait` listens there).
local function tracking(at)
  if ARGV[at] == nil or ARGV[at] == '' then
    return nil
  end
  local tasks = ARGV[at]
  -- `{N/p}:tasks` without `tasks`: the partition's other tracking keys.
  local partition = string.sub(tasks, 1, #tasks - 5)
  return {
    tasks = tasks, stale = ARGV[at + 1], keep = ARGV[at + 2],
    count = tonumber(ARGV[at + 3]), list = ARGV[at + 4], list_at = ARGV[at + 4] .. '_at',
    publish = ARGV[at + 5], channel = ARGV[at + 6],
    running = partition .. 'running', cancels = partition .. 'cancel_requests',
    ended = {}, appended = {}, finals = {}, done = {}, forget = {}, asked = nil,
  }
end

-- A record's names and values as a table, the last of each name winning
-- (false for no record).
local function decoded(record)
  local fields = {}
  if record then
    local values = { cmsgpack.unpack(record) }
    for i = 1, #values - 1, 2 do
      fields[values[i]] = values[i + 1]
    end
  end
  return fields
end

-- A record over this size is written anew from its decoded fields when
-- it changes, rather than appended to (a task handed back many times).
local COMPACT = 512

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

-- The value of the field '' (no task id is empty) of `{N/p}:tasks` and
-- `{N/p}:running`, longer than Redis keeps in a listpack
-- (hash-max-listpack-value, 64 by default), so that both hashes are hash
-- tables from their first write: in a listpack each field a batch writes
-- is found by a scan of the others (up to hash-max-listpack-entries, 512
-- in Redis 7.0 as packaged here), which was 28,800 instructions per write
-- and three fifths of what a tracked batch enqueue cost Redis. A literal,
-- made once as the script is loaded (tracking/mod.rs holds the same).
local PAD = '--------------------------------------------------------------------------------'

-- Calls `command key <items…>` in chunks: Lua unpacks at most a few
-- thousand values at once (1,000 is even, so field/value pairs stay whole).
local function chunked(command, key, items)
  for i = 1, #items, 1000 do
    redis.call(command, key, unpack(items, i, math.min(i + 999, #items)))
  end
end

-- Task `id`'s state, as this script left it or as Redis has it.
local function state_of(t, id)
  return t.done[id] or decoded(redis.call('HGET', t.tasks, id)).s
end

-- Appends `segment` (packed names and values) to task `id`'s record in
-- `tasks`, now; a long record is compacted.
local function append(tasks, id, segment)
  local record = redis.call('HGET', tasks, id)
  if record and #record > COMPACT then
    local fields = decoded(record .. segment)
    local flat = {}
    for name, value in pairs(fields) do
      flat[#flat + 1] = name
      flat[#flat + 1] = value
    end
    redis.call('HSET', tasks, id, cmsgpack.pack(unpack(flat)))
  else
    redis.call('HSET', tasks, id, (record or '') .. segment)
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

-- A state that is not final, with its names and values, written now;
-- `t` (touched) says when, for the sweep of records that stopped
-- changing. It no longer runs.
local function set_state(t, id, state, ...)
  append(t.tasks, id, cmsgpack.pack('s', state, 't', now_ms(), ...))
  redis.call('HDEL', t.running, id)
end

-- A final state: written with the script's other ends at `flush`, where
-- the task also joins the ended list, leaves the running hash and the
-- cancel requests, and is announced. What it ran as (`running`, its
-- running hash value if it has one: `instance|token|attempt|started_at`)
-- is kept as its `r` (readers split it).
local function finish(t, id, state, running, ...)
  if running then
    t.finals[#t.finals + 1] = cmsgpack.pack('s', state, 'f', now_ms(), 'r', running, ...)
  else
    t.finals[#t.finals + 1] = cmsgpack.pack('s', state, 'f', now_ms(), ...)
  end
  t.done[id] = state
  t.ended[#t.ended + 1] = id
  t.appended[#t.appended + 1] = id
end

-- The records of the oldest ended tasks go: those ended before the keep
-- time and those beyond the count, at most `most` in one call (each call
-- adds fewer than it may take, so the lists never outgrow their bound by
-- more than one script's ends). `{N/p}:ended_at` says when each run of
-- ids ended; a run the count cuts into is left with its remaining count.
-- A replayed task's id was taken out by the replay (replay.lua), so an id
-- always names a record that is still the one that ended.
local function evict(t, length, now, most)
  local over = math.max(length - t.count, 0)
  local oldest = now - tonumber(t.keep)
  -- Enough runs to take `most` ids even when each holds one (a cancel's),
  -- and 16 more for runs of none: a window of fixed size let an ack add
  -- 100 ids behind 16 single ends and take 16, and the count lagged.
  local runs = redis.call('LRANGE', t.list_at, 0, most + 15)
  -- `n` ids of `whole` runs go, and `cut` more of the run after them.
  local n, whole, cut = 0, 0, 0
  for _, run in ipairs(runs) do
    local at, k = string.match(run, '^(%d+) (%d+)$')
    k = tonumber(k)
    local expired = tonumber(at) < oldest
    if not expired and n >= over then
      break
    end
    local take = math.min(expired and k or over - n, most - n)
    if take < k then
      cut = take
      break
    end
    n, whole = n + k, whole + 1
  end
  if n + cut == 0 and whole == 0 then
    return
  end
  if whole > 0 then
    -- (Runs of none, left by replays, go too.)
    redis.call('LPOP', t.list_at, whole)
  end
  if cut > 0 then
    local at, k = string.match(runs[whole + 1], '^(%d+) (%d+)$')
    redis.call('LSET', t.list_at, 0, at .. ' ' .. (tonumber(k) - cut))
  end
  if n + cut > 0 then
    local ids = redis.call('LPOP', t.list, n + cut)
    if ids then
      chunked('HDEL', t.tasks, ids)
    end
  end
end

-- The script's ends, written once: the records (each final state built
-- here appended to what its record held; the whole records an ack was
-- given, written by it), the ended lists (and their eviction), the running
-- hash, the cancel requests acted on, one message on the final channel.
local function flush(t)
  if not t then
    return
  end
  chunked('ZREM', t.cancels, t.forget)
  if #t.ended == 0 then
    return
  end
  local writes = {}
  for i = 1, #t.appended, 1000 do
    local last = math.min(i + 999, #t.appended)
    local records = redis.call('HMGET', t.tasks, unpack(t.appended, i, last))
    for k = i, last do
      writes[#writes + 1] = t.appended[k]
      writes[#writes + 1] = (records[k - i + 1] or '') .. t.finals[k]
    end
  end
  chunked('HSET', t.tasks, writes)
  local now = now_ms()
  local length = 0
  for i = 1, #t.ended, 1000 do
    length = redis.call('RPUSH', t.list, unpack(t.ended, i, math.min(i + 999, #t.ended)))
  end
  redis.call('RPUSH', t.list_at, now .. ' ' .. #t.ended)
  evict(t, length, now, #t.ended + 8)
  chunked('HDEL', t.running, t.ended)
  redis.call(t.publish, t.channel, table.concat(t.ended, ' '))
end

-- A cancelled task leaves: its record says so once (a later script finds
-- it final and leaves it). `acked`: its entry leaves too (a fenced script
-- acked it), so its cancel request has done its work and goes; a cancel
-- that ends a task whose entry still waits (`cancel.lua`) keeps it, for
-- the script that will ack that entry.
local function cancelled(t, id, acked)
  if not FINAL[state_of(t, id)] then
    finish(t, id, 'cancelled', redis.call('HGET', t.running, id), 'w', 'user')
  end
  if acked then
    t.forget[#t.forget + 1] = id
  end
end

-- With tracking: whether task `id` goes on; false once it ended
-- `cancelled` because a cancel request came first (its caller then adds
-- it nowhere).
local function unless_cancelled(t, id)
  if asked(t, id) then
    cancelled(t, id, true)
    return false
  end
  return true
end
