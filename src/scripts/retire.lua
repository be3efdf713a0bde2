-- docs/design.md §21: retires a sealed partition once nothing is left in
-- it, only while this instance is the recorded owner (§4 rule 8): no
-- entry pending, none undelivered (the group has read up to the last
-- entry), no delayed task and no dead letter (both moved to the new
-- layout). The record is never removed: it is what the open waits for.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner     KEYS[3] = {N/p}:sealed
-- KEYS[4] = {N/p}:delayed    KEYS[5] = {N/p}:dead      KEYS[6] = {N/p}:retired
-- KEYS[7] = {N/p}:completions (batch members' ends not yet forwarded: the
-- owner forwards them first, as it does every second)
-- KEYS[8..12] = the task records (§14): {N/p}:tasks, :running,
-- :cancel_requests, :ended, :ended_at
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group
-- ARGV[3] = how long the service keeps a final record (ms)
-- Returns 1 when retired (now or before), 0 while entries are pending or
-- undelivered, or members' ends wait to be forwarded (or it is not sealed), 2 while delayed tasks or dead letters
-- wait to be moved, -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
if redis.call('EXISTS', KEYS[6]) == 1 then
  return 1
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 0
end
if redis.call('XPENDING', KEYS[1], ARGV[2])[1] > 0 or redis.call('XLEN', KEYS[7]) > 0 then
  return 0
end
-- Stream ids compared as (ms, seq): both fit Lua's numbers exactly.
local function parts(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if #last > 0 then
  local delivered = '0-0'
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local fields = {}
    for i = 1, #group, 2 do
      fields[group[i]] = group[i + 1]
    end
    if fields['name'] == ARGV[2] then
      delivered = fields['last-delivered-id']
    end
  end
  local lm, ls = parts(last[1][1])
  local dm, ds = parts(delivered)
  if lm > dm or (lm == dm and ls > ds) then
    return 0
  end
end
if redis.call('ZCARD', KEYS[4]) > 0 or redis.call('XLEN', KEYS[5]) > 0 then
  return 2
end
redis.call('SET', KEYS[6], '1')
-- Every task left here is final (the moved ones' records went with them,
-- §21): the partition has no owner from the open on to evict its records
-- by time, so they go, with their lists, the keep time from now.
for i = 8, 12 do
  redis.call('PEXPIRE', KEYS[i], ARGV[3])
end
return 1
