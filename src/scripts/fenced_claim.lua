-- Rules 3 and 8 (docs/design.md §4): the owner takes over entries other consumers
-- left pending in its partition, only while it is the recorded owner (a
-- stale owner that claimed would run tasks the real owner runs too).
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = consumer
-- ARGV[4] = min idle (ms)     ARGV[5] = start id     ARGV[6] = count
-- ARGV[7] = 'JUSTID' (optional): ordered mode, where the delivery count is
--           the attempt record and a claim must not add to it
-- Returns XAUTOCLAIM's reply, or -1 when fenced. Without JUSTID (concurrent
-- mode), a fourth part: each claimed entry's delivery count, this claim
-- counted (docs/design.md §6, earlier deliveries), read here because a
-- re-read of the claimer's own pending list may count one more before a
-- separate read would.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if ARGV[7] == 'JUSTID' then
  return redis.call('XAUTOCLAIM', KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], 'COUNT', ARGV[6], 'JUSTID')
end
local claimed = redis.call('XAUTOCLAIM', KEYS[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], 'COUNT', ARGV[6])
local counts = {}
for i, entry in ipairs(claimed[2]) do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[2], entry[1], entry[1], 1)
  counts[i] = pending[1] and pending[1][4] or 1
end
return { claimed[1], claimed[2], claimed[3] or {}, counts }
