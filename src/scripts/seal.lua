-- docs/design.md §21: the owner of a partition of the generation a reshard
-- replaces seals it, only while it is the recorded owner (§4 rule 8). From
-- then on every `XADD … *` into the stream fails ("exhausted the last
-- possible ID"), nothing applied, whoever sends it (any version, any
-- language), and the scripts that add entries find `{N/p}:sealed`. The
-- stream, its group and its pending entries stay for the owner to drain.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = {N/p}:sealed
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = the new generation
-- Returns 1 when sealed (now or before), -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], 'peerq', '0', 'MKSTREAM')
end
redis.call('XSETID', KEYS[1], '18446744073709551615-18446744073709551615')
redis.call('SET', KEYS[3], ARGV[2])
return 1
