-- Rule 8 (docs/design.md §4): move an entry (a retry, a dead letter, a hand-back)
-- only while this instance is the partition's recorded owner: ack it in the
-- partition's stream and add its new form to the destination, atomically.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = destination
-- ({N/p}:stream or {N/p}:dead)
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = entry id
-- ARGV[4..] = the new entry's field, value, ...
-- Returns 1 when moved, 0 when the entry was no longer pending (a retried
-- call whose first reply was lost: it is not added twice), -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local acked = redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
if acked == 1 then
  redis.call('XADD', KEYS[3], '*', unpack(ARGV, 4))
end
return acked
