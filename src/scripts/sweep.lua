-- docs/design.md §14: the owner's care of a partition's task records,
-- now and then (track.lua is prepended: `evict`, `decoded`, FINAL, now_ms).
--
-- First the final records past the keep time or beyond the count go, as
-- the scripts that end tasks do (`flush`): here for a partition where no
-- task ends any more, whose last ends would otherwise stay.
--
-- Then, given a cursor, a slice of `{N/p}:tasks` is swept. A record that
-- is not final has no expiry (a hash field has none in Redis 7.0), so
-- this forgets those whose last time (enqueued, due, touched, cancel
-- requested: `q`, `d`, `t`, `c`) is older than the sweep time and that do not run: a task
-- enqueued with tracking on and acked with it off, an entry an operator
-- deleted, a cancel request for a task that never came (a task that waits
-- longer than that loses its record, and has one again from its start).
--
-- Neither moves a task, so neither is fenced: a stale owner's call deletes
-- only what the owner's would.
-- KEYS[1] = {N/p}:tasks (as the tracking block names it)
-- ARGV[1] = the sweep's cursor ('0' to begin a pass; '': no sweep)
-- ARGV[2] = how many fields to look at     ARGV[3..9] = the tracking block
-- Returns { the next cursor ('0': a pass ended), records forgotten, ms
-- until the oldest final record left is due to go (-1: none left) }.
local t = tracking(3)
local now = now_ms()
local length = redis.call('LLEN', t.list)
local due = -1
if length > 0 then
  evict(t, length, now, 1000)
  local run = redis.call('LINDEX', t.list_at, 0)
  if run then
    due = math.max(tonumber(string.match(run, '^%d+')) + tonumber(t.keep) - now, 0)
  end
end
if ARGV[1] == '' then
  return { '', 0, due }
end
local scan = redis.call('HSCAN', t.tasks, ARGV[1], 'COUNT', ARGV[2])
local oldest = now - tonumber(t.stale)
local gone = {}
for i = 1, #scan[2], 2 do
  local id = scan[2][i]
  local r = id ~= '' and decoded(scan[2][i + 1])
  if r and not FINAL[r.s] and redis.call('HEXISTS', t.running, id) == 0 then
    local last = math.max(tonumber(r.q) or 0, tonumber(r.d) or 0,
      tonumber(r.t) or 0, tonumber(r.c) or 0)
    if last < oldest then
      gone[#gone + 1] = id
    end
  end
end
chunked('HDEL', t.tasks, gone)
return { scan[1], #gone, due }
