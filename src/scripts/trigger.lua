-- DESIGN.md §6: triggers one due time of a periodic job, once across the
-- service: claims the due time and enqueues the job's task in one step.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:cron:<job>:<due ms>
-- ARGV[1] = how long the claim is kept (ms)     ARGV[2..] = field, value, ...
-- Returns 1 when this call triggered it, 0 when it was triggered already.
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) == false then
  return 0
end
redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
return 1
