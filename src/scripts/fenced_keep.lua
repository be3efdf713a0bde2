-- docs/design.md §4: keep the entries this instance still runs fresh (their idle
-- time reset), so that claiming never takes a task still running on its
-- owner; only while it is the recorded owner, so a stale owner never takes
-- entries back from the partition's new owner.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group     ARGV[3] = consumer
-- ARGV[4..] = entry ids
-- Returns the number of entries kept, or -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
-- (unpack expands only as the last argument, so the call is built first.)
local args = {'XCLAIM', KEYS[1], ARGV[2], ARGV[3], 0}
for i = 4, #ARGV do args[#args + 1] = ARGV[i] end
args[#args + 1] = 'JUSTID'
return #redis.call(unpack(args))
