-- docs/design.md §10: the outbox relay's dead letter of a row it cannot
-- enqueue, at most once per task: a relay killed after this, before its
-- delete committed, sends the row again, and the dedup record that an
-- enqueue would have written keeps it from a second letter. As in
-- `enqueue.lua`, the record has no expiry until the relay gives it one
-- (after the row's delete committed), and nothing is written past the
-- claim's deadline by Redis's clock.
-- KEYS[1] = {N/p}:dead     KEYS[2] = {N/p}:dedup:outbox:<task id>
-- ARGV[1] = the claim's deadline (Unix ms, Redis's clock)     ARGV[2] = task id
-- ARGV[3..] = the letter's field, value, ...
-- Returns 1 when written, 0 when the record was there already, -1 past
-- the deadline (nothing written).
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[1]) then
  return -1
end
if redis.call('GET', KEYS[2]) then
  return 0
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], ARGV[2])
return 1
