-- docs/design.md §15, limits per key by a function of the task: what each
-- instance holds of each limit key, across the service, in one call for
-- many keys (all in the service's slot).
--
-- KEYS[i] = {N}:units:<key> (units of the key's concurrency) or
-- {N}:rate:<key> (shares of the key's rate, a count per the limit's
-- period), each a hash with a field per instance holding some,
-- '<count> <short> <lapse>': how much it holds, how much more it asked for
-- and was refused, and when the field lapses (Unix ms, Redis's clock)
-- unless its holder keeps it again. The live counts of a key never add up
-- to more than the limit.
--
-- ARGV[1] = this instance's id    ARGV[2] = how long a field lives, ms
-- ARGV[3] = units one key may have    ARGV[4] = a key's rate: its count
-- then per operation i, ARGV[2 + 3i], ARGV[3 + 3i], ARGV[4 + 3i]:
-- 'u' (units) or 'r' (rate), what its tasks may use now, what it wants:
-- the instance's count becomes what it wants, as far as the others' live
-- counts leave room (and, while others are short, no more than an even
-- share), but never less than what its tasks may use of its live count
-- (that was counted already: a task may be taking some as this runs); 0
-- and nothing short removes the field.
-- Returns per operation a pair: the count granted, and the even share
-- while another instance is short of the key, else 0 (the holder then
-- gives back down to it).
-- Never in a partition's script, and no fenced script touches these keys:
-- like {N}:rate they are the limiter's state, not a task's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = ARGV[1]
local ttl = tonumber(ARGV[2])
local limits = { u = tonumber(ARGV[3]), r = tonumber(ARGV[4]) }
local out = {}
for i = 1, #KEYS do
  local key, most = KEYS[i], limits[ARGV[2 + 3 * i]]
  local a, b = tonumber(ARGV[3 + 3 * i]), tonumber(ARGV[4 + 3 * i])
  local fields = redis.call('HGETALL', key)
  local mine, others, sharing, short_others = 0, 0, 1, 0
  for j = 1, #fields, 2 do
    local f = fields[j]
    local c, s, l = string.match(fields[j + 1], '^(%d+) (%d+) (%d+)$')
    c, s, l = tonumber(c), tonumber(s), tonumber(l)
    if l < now then
      -- A holder that stopped keeping its part (a crash, a freeze, cut off
      -- from Redis) holds it no more.
      if f ~= me then
        redis.call('HDEL', key, f)
      end
    elseif f == me then
      mine = c
    else
      others = others + c
      if s > 0 then
        short_others = 1
      end
      sharing = sharing + 1
    end
  end
  local g = math.min(b, math.max(0, most - others))
  local share = 0
  if short_others == 1 then
    share = math.ceil(most / sharing)
    g = math.min(g, share)
  end
  g = math.max(g, math.min(a, mine))
  local short = math.max(0, b - g)
  if g == 0 and short == 0 then
    redis.call('HDEL', key, me)
  else
    redis.call('HSET', key, me, g .. ' ' .. short .. ' ' .. (now + ttl))
    -- The key goes once its last holder stops keeping it.
    redis.call('PEXPIRE', key, ttl)
  end
  out[i] = { g, share }
end
return out
