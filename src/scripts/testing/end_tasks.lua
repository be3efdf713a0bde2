-- Tests only (src/tracking/eviction_tests.rs): ends ARGV[8] tasks named
-- ARGV[9] .. i, `succeeded`, in one script, as an ack of that many tracked
-- tasks does, and returns the length of the partition's ended list.
-- ARGV[1..7] = the tracking block (track.lua).
local t = tracking(1)
for i = 1, tonumber(ARGV[8]) do
  finish(t, ARGV[9] .. i, 'succeeded', false)
end
flush(t)
return redis.call('LLEN', t.list)
