-- Rule 8: acknowledge entries only while this instance is the partition's
-- recorded owner with this token; a stale owner learns it is fenced.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3..] = entry ids
-- Returns the number acknowledged, or -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
return redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, 3))
