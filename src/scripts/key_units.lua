-- docs/design.md §15, concurrency per key by a function of the task: the
-- units of each limit key that instances hold, across the service. One
-- sorted set per key, in the service's slot: member '<instance id>/<unit>',
-- score = when the unit lapses (Unix ms, by Redis's clock) unless its
-- holder keeps it again.
-- KEYS[i] = {N}:units:<key> of operation i
-- ARGV[1] = how many units one key may have (the limit)
-- ARGV[2] = how long a unit lives without a keep, ms
-- ARGV[1 + 2i] = operation i: 'a' take a unit, 'k' keep one, 'r' give one back
-- ARGV[2 + 2i] = its unit (member)
-- Returns per operation: 1 (taken, kept, given back), or 0 (the key is at
-- its limit; or a keep of a unit that lapsed and is gone).
-- Never in a partition's script, and no fenced script touches these keys:
-- like {N}:rate they are the limiter's state, not a task's.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local most = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local key, op, unit = KEYS[i], ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  if op == 'r' then
    redis.call('ZREM', key, unit)
    out[i] = 1
  elseif op == 'k' then
    if redis.call('ZSCORE', key, unit) then
      redis.call('ZADD', key, now + ttl, unit)
      out[i] = 1
    else
      out[i] = 0
    end
  else
    -- Units whose holders stopped keeping them (a crash, a freeze) lapse.
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
    if redis.call('ZCARD', key) < most then
      redis.call('ZADD', key, now + ttl, unit)
      out[i] = 1
    else
      out[i] = 0
    end
  end
  -- A key whose holders all stopped goes away with its last unit.
  if redis.call('EXISTS', key) == 1 then
    redis.call('PEXPIRE', key, ttl)
  end
end
return out
