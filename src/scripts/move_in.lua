-- docs/design.md §21: a delayed task or a dead letter of a sealed
-- partition arrives in the partition of the new layout its key routes it
-- to, with its task record (§14) when it has one. Under Cluster the two
-- partitions are in different slots, so the move is two steps: this one
-- in the destination, then the source's delete (`moved.lua`), which
-- deletes only when the source still holds what was copied here; a move
-- repeated after a crash, or after a cancel changed the source between
-- the steps, changes nothing here but the record, written again as the
-- source has it now (a delayed member is the entry's bytes, added again as
-- the same member; a dead letter is added once per source reference,
-- which `{N/p}:moved` records for a week). Nothing in the destination
-- runs before the open, so no write here can undo one made by a run.
-- KEYS[1] = the destination ({N/p}:delayed or {N/p}:dead)
-- KEYS[2] = {N/p}:unique     KEYS[3] = {N/p}:moved
-- KEYS[4] = {N/p}:tasks      KEYS[5] = {N/p}:cancel_requests
-- KEYS[6] = {N/p}:ended      KEYS[7] = {N/p}:ended_at
-- ARGV[1] = 'delayed' or 'dead'     ARGV[2] = the source's reference
-- (`<partition>/<id>`, for a dead letter)     ARGV[3] = the due time (a
-- delayed task)     ARGV[4] = the member's bytes (a delayed task)
-- ARGV[5] = the unique key ('': none)     ARGV[6] = the task id
-- ARGV[7] = the task's record as the source holds it ('': none)
-- ARGV[8] = its cancel request's time ('': none)
-- ARGV[9] = '1' when the record is final (it joins the retention lists)
-- ARGV[10..] = field, value, ... (a dead letter)
-- Returns 1 when added, 0 when added before.
local PAD = '--------------------------------------------------------------------------------'

-- The task's record, written as the source holds it (`extra`: what the
-- move changes in it); a final one joins the partition's retention lists
-- the first time (track.lua's `flush` and `evict` keep them).
local function record(extra)
  if ARGV[7] == '' then
    return
  end
  local new = redis.call('HEXISTS', KEYS[4], ARGV[6]) == 0
  redis.call('HSET', KEYS[4], '', PAD, ARGV[6], ARGV[7] .. extra)
  if ARGV[8] ~= '' then
    redis.call('ZADD', KEYS[5], 'NX', ARGV[8], ARGV[6])
  end
  if new and ARGV[9] == '1' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('RPUSH', KEYS[6], ARGV[6])
    redis.call('RPUSH', KEYS[7], now .. ' 1')
  end
end

if ARGV[1] == 'delayed' then
  local added = redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
  -- The unique lock follows its holder (docs/design.md §16).
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[5], 'd:' .. ARGV[3] .. ' ' .. ARGV[6])
  end
  record('')
  return added
end
if redis.call('HSETNX', KEYS[3], ARGV[2], '1') == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[3], 604800000)
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 10))
-- The record names the letter by its id here (`x`, its dead_id).
record(cmsgpack.pack('x', id))
return 1
