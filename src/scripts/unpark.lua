-- docs/design.md §21: a batch's callback (or a chain's next step) that
-- its sealed home partition parked arrives in the partition of the
-- layout in use its key (or id) routes it to, once: a dedup record of its
-- own, kept a week, makes a send repeated after a crash (before the
-- parked field's delete) add nothing.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:dedup:parked:<task id>
-- KEYS[3] = {N/p}:sealed
-- ARGV = the entry's fields, names and values
-- Returns 1 when added (now or before), 2 when the partition is sealed
-- too (another reshard began: nothing written; sent again with the
-- layout the next look reads).
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 1
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 2
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV))
redis.call('SET', KEYS[2], '1', 'PX', 604800000)
return 1
