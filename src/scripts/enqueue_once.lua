-- DESIGN.md §6: enqueues a task once per idempotency key: the dedup record
-- and the entry are written in one step, so a producer that retries after
-- an ambiguous failure enqueues it once.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:dedup:<key>
-- ARGV[1] = record TTL (ms)     ARGV[2] = task id     ARGV[3..] = field, value, ...
-- Returns the id of the task enqueued under the key: this one, or the
-- earlier one.
local earlier = redis.call('GET', KEYS[2])
if earlier then
  return earlier
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1])
return ARGV[2]
