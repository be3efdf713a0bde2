-- docs/design.md §21: opens the new generation once every partition of the
-- one it replaces is retired (the caller has read every retired record):
-- it is live from epoch O on, so every round of epoch O or later reads the
-- open layout, and every assignment before O keeps the old one. With R the
-- round whose interval holds this write (by Redis's clock), the rounds of
-- epoch R + 1 run from R * I on by their clocks, no earlier than
-- R * I - S by Redis's: O = R + 1 when this write lands before that, with
-- 50 ms to spare, else R + 2.
-- KEYS[1] = {N}:layout     ARGV[1] = the generation to open
-- ARGV[2] = the round interval in ms     ARGV[3] = the tolerated skew in ms
-- Returns O, or 0 when the layout is not that generation draining (opened
-- by another instance already, or another reshard).
local state = redis.call('HGET', KEYS[1], 'state')
local generation = redis.call('HGET', KEYS[1], 'generation')
if state ~= 'draining' or generation ~= ARGV[1] then
  return 0
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[2])
local round = math.floor(now_ms / interval) + 1
local open_epoch = round + 2
if now_ms + tonumber(ARGV[3]) + 50 < round * interval then
  open_epoch = round + 1
end
redis.call('HSET', KEYS[1], 'state', 'open', 'open_epoch', open_epoch, 'opened_ms', now_ms)
return open_epoch
