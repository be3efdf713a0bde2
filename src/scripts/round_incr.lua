-- One indexer round in Incr mode, the seed's algorithm (DESIGN.md §2).
-- KEYS[1] = {N}:<number>       this round's counter
-- KEYS[2] = {N}:<number - 1>   the previous round's
-- ARGV[1] = key TTL in ms
-- ARGV[2] = the latest Redis time (µs since the epoch) at which the INCR may
--           land, or 0 to write nothing (a leaving instance)
-- ARGV[3] = '1' to read the previous round's final count
-- Returns {written, the INCR's value or 0, previous count or nil, redis time in µs};
-- written is 1, 0 (not asked) or -1 (refused: too late).
--
-- The write is refused by Redis's own clock, not only by the client's: a
-- request delayed in the network must not land after others have read the
-- count, or two instances would read different replicas for one epoch.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local write_by = tonumber(ARGV[2])
local written, value = 0, 0
if write_by > 0 then
  if now <= write_by then
    value = redis.call('INCR', KEYS[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[1])
    written = 1
  else
    written = -1
  end
end
local count = false
if ARGV[3] == '1' then
  count = redis.call('GET', KEYS[2])
end
return {written, value, count, now}
