-- docs/design.md §16 (unique keys), prepended to every script that takes,
-- moves or frees a unique key's lock. A partition's locks are fields of one
-- hash, `{N/p}:unique`: unique key → `<where> <task id>`, where `where` is
-- the task's entry now, `s:<stream id>` (waiting or pending in the
-- partition's stream) or `d:<due ms>` (in the delayed set). The script that
-- writes a task's next entry (a retry, a hand-back, a take-over, a
-- promotion) writes its `where` in the same step, and the script that ends
-- it (ack, dead letter, cancel) frees its key, so a lock names its task's
-- one live entry whatever happened to the instances. Each write checks
-- that the lock still names this task: a key freed and taken by a newer
-- task is never touched by the older one's scripts.

-- The partition's lock hash, named after its stream `{N/p}:stream`.
local function locks_of(stream)
  return string.sub(stream, 1, #stream - 6) .. 'unique'
end

-- The value of field `name` among the field, value pairs of ARGV from
-- `from` (the last one, as a reader counts it), or nil. Only a loop over
-- the entry's few fields: no command.
local function field_of(from, name)
  local found = nil
  for i = from, #ARGV - 1, 2 do
    if ARGV[i] == name then
      found = ARGV[i + 1]
    end
  end
  return found
end

-- The same among the fields of a table (a delayed member, unpacked).
local function field_in(fields, name)
  local found = nil
  for i = 1, #fields - 1, 2 do
    if fields[i] == name then
      found = fields[i + 1]
    end
  end
  return found
end

-- The lock of `key`: where its task is and its id, or nil.
local function holder(locks, key)
  local held = redis.call('HGET', locks, key)
  if not held then
    return nil, nil
  end
  local where, id = string.match(held, '^(%S+) (.*)$')
  return where, id
end

-- Frees `key` if task `id` holds it.
local function release(locks, key, id)
  if key and key ~= '' then
    local _, held_by = holder(locks, key)
    if held_by == id then
      redis.call('HDEL', locks, key)
    end
  end
end

-- Says that task `id`, if it holds `key`, is now at `where`.
local function relocate(locks, key, id, where)
  if key and key ~= '' then
    local _, held_by = holder(locks, key)
    if held_by == id then
      redis.call('HSET', locks, key, where .. ' ' .. id)
    end
  end
end

-- A stream id's two numbers.
local function stream_id(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  return tonumber(ms or 0), tonumber(seq or 0)
end

-- Whether stream id `a` comes after `b`.
local function after(a, b)
  local ams, aseq = stream_id(a)
  local bms, bseq = stream_id(b)
  return ams > bms or (ams == bms and aseq > bseq)
end

-- Whether task `id`'s entry at `where` still lives: in the delayed set
-- under its due time, or in the stream either not yet read by the group
-- or pending in it. An entry acked, trimmed or deleted is gone: the task
-- ended or moved without saying so (an operator's `XDEL`, an instance of a
-- version without unique keys), and its lock is stale. At most four
-- commands, each O(log n): the price of a refused enqueue, not of a task.
local function alive(stream, delayed, group, where, id)
  local kind, at = string.sub(where, 1, 1), string.sub(where, 3)
  if kind == 'd' then
    for _, member in ipairs(redis.call('ZRANGE', delayed, at, at, 'BYSCORE')) do
      if string.find(member, id, 1, true) then
        return true
      end
    end
    return false
  end
  if #redis.call('XRANGE', stream, at, at) == 0 then
    return false
  end
  local last = nil
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
    local fields = {}
    for i = 1, #g - 1, 2 do
      fields[g[i]] = g[i + 1]
    end
    if fields['name'] == group then
      last = fields['last-delivered-id']
    end
  end
  -- No group yet (no consumer ever started), or not read yet: waiting.
  if not last or after(at, last) then
    return true
  end
  return #redis.call('XPENDING', stream, group, at, at, 1) > 0
end
