-- One indexer round in Incr mode, the seed's algorithm (docs/design.md §2).
-- KEYS[1] = {N}:<number>           this round's counter
-- KEYS[2] = {N}:<number>:by        who took which value from it
-- KEYS[3] = {N}:<number - 1>       the previous round's counter
-- KEYS[4] = {N}:<number - 1>:by    and its takers
-- ARGV[1] = instance id            ARGV[2] = key TTL in ms
-- ARGV[3] = the latest Redis time (µs since the epoch) at which the INCR may
--           land, or 0 to write nothing
-- ARGV[4] = '1' to read the previous round
-- Returns {written, the INCR's value or 0, previous count or nil,
--          this instance's value in the previous round or nil,
--          number of takers in the previous round, redis time in µs};
-- written is 1, 0 (not asked) or -1 (refused: too late).
--
-- The write is refused by Redis's own clock, not only by the client's: a
-- request delayed in the network must not land after others have read the
-- count, or two instances would read different replicas for one epoch.
--
-- The takers hash lets an instance check that the counter it reads is the
-- one it incremented: if Redis lost the counter (a restart without fsync, a
-- failover) and it was incremented again, two instances would hold the same
-- value. Ranked mode needs no such record: its members are the record.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local write_by = tonumber(ARGV[3])
local written, value = 0, 0
if write_by > 0 then
  if now <= write_by then
    value = redis.call('INCR', KEYS[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('HSET', KEYS[2], ARGV[1], value)
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
    written = 1
  else
    written = -1
  end
end
-- KEYS[5] = {N}:layout: read with the count, so the assignment carries the
-- layout that held when its count was read (docs/design.md §21).
local count, held, takers, layout = false, false, 0, {}
if ARGV[4] == '1' then
  layout = redis.call('HGETALL', KEYS[5])
  count = redis.call('GET', KEYS[3])
  held = redis.call('HGET', KEYS[4], ARGV[1])
  takers = redis.call('HLEN', KEYS[4])
end
return {written, value, count, held, takers, now, layout}
