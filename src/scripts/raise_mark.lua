-- docs/design.md §21: a periodic job's mark in the new layout rises to its
-- mark in a sealed partition of the replaced one (copied once the old
-- trigger refuses, so no due time fires in both layouts). Only upward: a
-- trigger in the new layout may have moved it past already.
-- KEYS[1] = {N/p}:cron:<job>     ARGV[1] = the replaced layout's mark
local mark = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) > mark then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
