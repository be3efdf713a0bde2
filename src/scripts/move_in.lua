-- docs/design.md §21: a delayed task or a dead letter of a sealed
-- partition arrives in the partition of the new layout its key routes it
-- to. Under Cluster the two partitions are in different slots, so the move
-- is two steps: this one in the destination, then the source's delete; a
-- move repeated after a crash between them changes nothing here (a
-- delayed member is the entry's bytes, added again as the same member; a
-- dead letter is added once per source reference, which `{N/p}:moved`
-- records for a week).
-- KEYS[1] = the destination ({N/p}:delayed or {N/p}:dead)
-- KEYS[2] = {N/p}:unique     KEYS[3] = {N/p}:moved
-- ARGV[1] = 'delayed' or 'dead'     ARGV[2] = the source's reference
-- (`<partition>/<id>`, for a dead letter)     ARGV[3] = the due time (a
-- delayed task)     ARGV[4] = the member's bytes (a delayed task)
-- ARGV[5] = the unique key ('': none)     ARGV[6] = the task id
-- ARGV[7..] = field, value, ... (a dead letter)
-- Returns 1 when added, 0 when added before.
if ARGV[1] == 'delayed' then
  local added = redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
  -- The unique lock follows its holder (docs/design.md §16).
  if ARGV[5] ~= '' then
    redis.call('HSET', KEYS[2], ARGV[5], 'd:' .. ARGV[3] .. ' ' .. ARGV[6])
  end
  return added
end
if redis.call('HSETNX', KEYS[3], ARGV[2], '1') == 0 then
  return 0
end
redis.call('PEXPIRE', KEYS[3], 604800000)
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 7))
return 1
