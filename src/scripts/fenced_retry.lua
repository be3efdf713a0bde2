-- docs/design.md §6 and §4 rule 8: a failed attempt's retry, written with the
-- ack of the failed entry, only while this instance is the partition's
-- recorded owner. With a delay the next attempt waits in the partition's
-- delayed set (scored by Redis's clock, so instance clocks do not matter);
-- the partition's owner moves it into the stream when due.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = {N/p}:delayed
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = entry id
-- ARGV[4] = delay (ms)     ARGV[5..] = the next attempt's field, value, ...
-- Returns 1 when retried, 0 when the entry was no longer pending (a call
-- repeated after a lost reply: nothing is added twice), -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
local acked = redis.call('XACK', KEYS[1], ARGV[2], ARGV[3])
if acked == 0 then
  return 0
end
local delay = tonumber(ARGV[4])
if delay <= 0 then
  redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
  return 1
end
local fields = {}
for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
local now = redis.call('TIME')
local due = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + delay
redis.call('ZADD', KEYS[3], due, cmsgpack.pack(fields))
return 1
