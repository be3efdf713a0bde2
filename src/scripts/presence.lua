-- An instance's presence (docs/design.md §7), in one step: its members
-- record, the removal of records gone stale, and a flush of its task counts
-- that Redis applies once however often it is sent.
--
-- KEYS[1] = {N}:members   KEYS[2] = {N}:stats:flushed
-- KEYS[3] = {N}:stats:<the current minute>
-- KEYS[4..] = {N}:stats:<minute>, one per minute flushed
-- ARGV[1] = instance id   ARGV[2] = its record (JSON)
-- ARGV[3] = remove records last seen before this time (ms; 0: do not look)
-- ARGV[4] = the flush's sequence number (0: no counts)
-- ARGV[5] = how long the counts live (s)
-- ARGV[6] = the backlog of the partitions it owns ('': none owned)
-- ARGV[7..] = for each flushed minute key: ok, failed, dead, retried
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
-- A gauge, not a count: the minute keeps each instance's last figure
-- (`backlog:<instance id>`), and a reader adds them up.
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[3], 'backlog:' .. ARGV[1], ARGV[6])
  redis.call('EXPIRE', KEYS[3], ARGV[5])
end
local gone_before = tonumber(ARGV[3])
if gone_before > 0 then
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local decoded, record = pcall(cjson.decode, all[i + 1])
    local seen = decoded and type(record) == 'table' and tonumber(record['seen_at_ms'])
    if not seen or seen < gone_before then
      redis.call('HDEL', KEYS[1], all[i])
      redis.call('HDEL', KEYS[2], all[i])
    end
  end
end
local seq = tonumber(ARGV[4])
if seq == 0 then
  return 0
end
local last = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
if seq <= last then
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], seq)
redis.call('EXPIRE', KEYS[2], ARGV[5])
local fields = {'ok', 'failed', 'dead', 'retried'}
for k = 4, #KEYS do
  local base = 7 + (k - 4) * 4
  for f = 1, 4 do
    local n = tonumber(ARGV[base + f - 1])
    if n > 0 then
      redis.call('HINCRBY', KEYS[k], fields[f], n)
    end
  end
  redis.call('EXPIRE', KEYS[k], ARGV[5])
end
return 1
