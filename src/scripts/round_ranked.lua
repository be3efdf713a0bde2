-- One indexer round in Ranked mode (docs/design.md §2): write this round, read the previous.
-- KEYS[1] = {N}:<number>       this round's sorted set
-- KEYS[2] = {N}:<number - 1>   the previous round's
-- ARGV[1] = member name ('<instance id>@<weight>')   ARGV[2] = score (the instance's offset)
-- ARGV[3] = key TTL in ms
-- ARGV[4] = the latest Redis time (µs since the epoch) at which the write may
--           land, or 0 to write nothing (a leaving instance)
-- ARGV[5] = '1' to read this instance's rank and the count of the previous round
-- ARGV[6] = '1' to read the previous round's members too (rendezvous ownership)
-- ARGV[7] = '1' when the caller holds the member list of the round before the
--           previous one (KEYS[3]): the list is then sent only if it changed
-- KEYS[3] = {N}:<number - 2>   (rendezvous) the round before the previous
-- KEYS[4] = {N}:<number - 1>:same   (rendezvous) whether the previous round's
--           list equals the one before: compared once, by its first reader
-- KEYS[5] = {N}:layout         the service's layout (docs/design.md §21)
-- Returns {written, rank or nil, count, redis time in µs, members, unchanged,
-- layout}; layout is the flat field-value list of KEYS[5], read when the
-- previous round is (ARGV[5]), so the assignment carries the layout that
-- held when its count was read;
-- written is 1, 0 (not asked) or -1 (refused: too late); members is the
-- previous round's member names in rank order, or empty when not asked or
-- unchanged; unchanged is 1 when the caller's list (ARGV[7]) still holds.
--
-- Why the comparison: with a thousand instances, every instance reading every
-- member in every round is a million names a second for Redis to send and
-- the instances to parse (rounds failed on their timeout at 1,000, see
-- BENCHMARKS.md); a membership is stable most of the time, and both lists are
-- final once read (their rounds' writes have closed).
--
-- The write is refused by Redis's own clock, not only by the client's: a
-- request delayed in the network (a partition that heals, TCP retransmits)
-- must not land after others have read the count, or two instances would
-- read different replicas for one epoch.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local write_by = tonumber(ARGV[4])
local written = 0
if write_by > 0 then
  if now <= write_by then
    redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    written = 1
  else
    written = -1
  end
end
local function same_lists(a, b)
  if #a ~= #b then
    return false
  end
  for i = 1, #a do
    if a[i] ~= b[i] then
      return false
    end
  end
  return true
end

local rank, count, members, unchanged, layout = false, 0, {}, 0, {}
if ARGV[5] == '1' then
  layout = redis.call('HGETALL', KEYS[5])
  rank = redis.call('ZRANK', KEYS[2], ARGV[1])
  count = redis.call('ZCARD', KEYS[2])
  -- Read with the rank and the count: every instance reads one final list
  -- (the round's writes closed before anyone reads it).
  if ARGV[6] == '1' and rank then
    if ARGV[7] == '1' then
      local same = redis.call('GET', KEYS[4])
      if not same then
        members = redis.call('ZRANGE', KEYS[2], 0, -1)
        same = same_lists(members, redis.call('ZRANGE', KEYS[3], 0, -1)) and '1' or '0'
        redis.call('SET', KEYS[4], same, 'PX', ARGV[3])
      end
      if same == '1' then
        members, unchanged = {}, 1
      elseif #members == 0 then
        members = redis.call('ZRANGE', KEYS[2], 0, -1)
      end
    else
      members = redis.call('ZRANGE', KEYS[2], 0, -1)
    end
  end
end
return {written, rank, count, now, members, unchanged, layout}
