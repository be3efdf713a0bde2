-- docs/design.md §6: replays a dead letter: enqueues the task again and removes
-- it from the partition's dead letters, in one step, so a replay repeated
-- (after a lost reply, or by two operators) enqueues it once. The letter is
-- removed only once the task is enqueued (a script that fails half-way is
-- not rolled back). A tracked task's record (docs/design.md §14), if it has
-- one, follows the new run: `waiting` at attempt 1, its end forgotten (its
-- enqueue time and last error kept), and out of the ended lists, so that
-- the eviction of its earlier end does not take it (track.lua is
-- prepended).
-- KEYS[1] = {N/p}:dead     KEYS[2] = {N/p}:stream     KEYS[3] = {N/p}:tasks
-- KEYS[4] = {N/p}:ended     KEYS[5] = {N/p}:ended_at
-- ARGV[1] = the dead letter's id     ARGV[2] = the task id ('': none)
-- ARGV[3..] = the task's field, value, ...
-- A task with a unique key (its `unique` field, docs/design.md §16) takes
-- its lock again, unless another task holds it and lives: then nothing is
-- replayed, and the letter stays. A batch member (its `batch` field, §19)
-- is pending again in its batch: a completion record says so.
-- Returns { code, holder }: 1 when replayed, 0 when it was not there (any
-- more), -1 when it has no fields to replay, -2 when its unique key is
-- held, by the task `holder` names ('' otherwise), -3 when the partition
-- is sealed by a reshard (its letters move to the new layout).
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then
  return { 0, '' }
end
if #ARGV < 4 then
  return { -1, '' }
end
-- Sealed by a reshard (docs/design.md §21): the letter moves to the new
-- layout with the rest, and is replayed there.
if is_sealed(KEYS[2]) then
  return { -3, '' }
end
local unique = ARGV[2] ~= '' and field_of(3, 'unique')
local locks = locks_of(KEYS[2])
if unique then
  local where, held_by = holder(locks, unique)
  local delayed = string.sub(KEYS[2], 1, #KEYS[2] - 6) .. 'delayed'
  if held_by and held_by ~= ARGV[2] and alive(KEYS[2], delayed, 'peerq', where, held_by) then
    return { -2, held_by }
  end
end
local added = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
if unique then
  redis.call('HSET', locks, unique, 's:' .. added .. ' ' .. ARGV[2])
end
redis.call('XDEL', KEYS[1], ARGV[1])
completed(KEYS[2], field_of(3, 'batch'), field_of(3, 'id'), 'pending')
local id = ARGV[2]
local record = id ~= '' and redis.call('HGET', KEYS[3], id)
if record then
  local was = decoded(record)
  local at = redis.call('LPOS', KEYS[4], id)
  if at then
    -- One id fewer in the run of `{N/p}:ended_at` that holds it.
    local seen = 0
    for i, run in ipairs(redis.call('LRANGE', KEYS[5], 0, -1)) do
      local ended, k = string.match(run, '^(%d+) (%d+)$')
      seen = seen + tonumber(k)
      if seen > at then
        redis.call('LSET', KEYS[5], i - 1, ended .. ' ' .. (tonumber(k) - 1))
        break
      end
    end
    redis.call('LREM', KEYS[4], 1, id)
  end
  local fields = { 's', 'waiting', 'a', 1, 't', now_ms() }
  for _, name in ipairs({ 'q', 'e', 'u' }) do
    if was[name] then
      fields[#fields + 1] = name
      fields[#fields + 1] = was[name]
    end
  end
  redis.call('HSET', KEYS[3], id, cmsgpack.pack(unpack(fields)))
end
return { 1, '' }
