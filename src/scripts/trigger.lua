-- docs/design.md §6: triggers one due time of a periodic job, once across the
-- service: moves the job's high-water mark (the latest due time triggered)
-- to this due time and enqueues the job's task, in one step. A due time at
-- or below the mark was triggered already, or is older than one that was
-- (an instance that was paused, or that catches up on a missed one): it is
-- refused. A job's first mark is the time it was first registered
-- (periodic.rs, record_schedules), so a due time from before the job existed
-- is refused too. The mark never expires, so this holds for any period.
-- With tracking on, the task's record (docs/design.md §14) says `waiting`.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:cron:<job>
-- KEYS[3] = {N/p}:tasks
-- ARGV[1] = the due time (ms)     ARGV[2] = the task id, with tracking on
-- ('': no record)     ARGV[3] = the floor of the mark: the mark of the
-- job's partition in the layout a reshard replaced (docs/design.md §21),
-- -1 for none     ARGV[4..] = field, value, ...
-- Returns { 1, due } when this call triggered it, { 0, mark } when it was
-- refused, { -2, mark } when the partition is sealed by a reshard (nothing
-- written: its mark is frozen, the floor of the new layout's).
local mark = tonumber(redis.call('GET', KEYS[2]) or '-1')
if is_sealed(KEYS[1]) then
  return { -2, mark }
end
mark = math.max(mark, tonumber(ARGV[3]))
local due = tonumber(ARGV[1])
if due <= mark then
  return { 0, mark }
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
if ARGV[2] ~= '' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  -- The record as track.lua writes them: MessagePack names and values.
  redis.call('HSET', KEYS[3], ARGV[2], cmsgpack.pack('s', 'waiting', 'a', 1, 'q', now))
end
return { 1, due }
