-- Ordered mode: an entry retried in place keeps its attempt number in Redis,
-- as the entry's delivery count, so the partition's next owner continues the
-- count instead of starting again (max_attempts holds across handovers).
-- Written right before attempt ARGV[5] starts: any later delivery (a re-read
-- of the pending list, here or on the next owner) counts one more, the attempt
-- that may have run. Only while this instance is the recorded owner.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = consumer
-- ARGV[4] = entry id     ARGV[5] = the attempt that starts
-- Returns 1 when recorded, 0 when the entry is not pending, -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
return #redis.call('XCLAIM', KEYS[1], ARGV[2], ARGV[3], 0, ARGV[4], 'RETRYCOUNT', ARGV[5], 'JUSTID')
