-- docs/design.md §15: leases tokens of a service-wide rate limit (GCRA).
-- The key holds the theoretical arrival time (TAT): Unix µs, by Redis's clock,
-- up to which tokens are given out. Credit accrues one token per interval and
-- at most `burst` µs of it: a service idle for a while may start at most that
-- many tokens' worth at once.
-- KEYS[1] = {N}:rate
-- ARGV[1] = µs between two tokens (may be fractional)   ARGV[2] = burst, µs
-- ARGV[3] = tokens wanted (at least 1)
-- Returns { tokens granted, µs until the next token if none was }.
-- Never in a partition's script: one key of the service's slot, written by
-- every instance, that no fenced script touches.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
-- At least one token's worth, or a slow limit would never give one.
if burst < interval then
  burst = interval
end
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now - burst then
  tat = now - burst
end
local available = math.floor((now - tat) / interval)
if available < 1 then
  return { 0, math.ceil(tat + interval - now) }
end
local granted = math.min(want, available)
tat = tat + granted * interval
-- Once the TAT falls `burst` behind the clock it says nothing any more:
-- the key goes then.
local ttl = math.ceil((tat + burst - now) / 1000) + 1
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', ttl)
return { granted, 0 }
