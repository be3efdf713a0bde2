-- docs/design.md §10: the outbox relay's dead letter of a row it cannot
-- enqueue, at most once per task: a relay killed after this, before its
-- delete committed, sends the row again, and the dedup record that an
-- enqueue would have written keeps it from a second letter.
-- KEYS[1] = {N/p}:dead     KEYS[2] = {N/p}:dedup:outbox:<task id>
-- ARGV[1] = the record's TTL (ms)     ARGV[2] = task id
-- ARGV[3..] = the letter's field, value, ...
-- Returns 1 when written, 0 when the record was there already.
if redis.call('GET', KEYS[2]) then
  return 0
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1])
return 1
