-- Rule 8: acknowledge entries only while this instance is the partition's
-- recorded owner with this token; a stale owner learns it is fenced.
-- Tracked tasks (docs/design.md §14) are written `succeeded`, or
-- `cancelled` if a cancel request came first, only if this call acked them
-- (so no longer pending): when one `XACK` of them all acks fewer than it
-- was given (a call sent again after a lost reply), only the tasks whose
-- records are not final yet are written. The instance sends each
-- succeeded task's whole final record (its state, times, attempt, what it
-- ran as, progress and result: it knows them all), so that the common
-- case, no cancel request in the partition, writes them in one call with
-- no work per task here.
-- KEYS[1] = {N/p}:stream     KEYS[2] = {N/p}:owner
-- ARGV[1] = '<token>:<instance id>'     ARGV[2] = group
-- ARGV[3] = n, the untracked entries' count     ARGV[4..3+n] = their ids
-- then, with tracked tasks: the tracking block (track.lua), m, the tracked
-- tasks' count, their m stream ids, and m pairs of task id and record.
-- With unique tasks among them (docs/design.md §16), and only then:
-- KEYS[3] = {N/p}:unique, the tracking block's place holds '' if none is
-- tracked, and the last values are u pairs of task id and unique key, then
-- u: each key is freed if its task holds it. Without, this costs nothing.
-- With batch members among them (docs/design.md §19), and only then:
-- KEYS[3] is named (u may be 0), KEYS[4] = {N/p}:completions, and after
-- the unique keys' values comes the members' block, then its length L:
-- the members' first and last stream id (the instance finds them: Lua's
-- parsing of stream ids cost more than all else a member costs here),
-- then one group per batch: its id, c, 1 if it wants results (else 0),
-- and c pairs of task id and stream id (triples, with the result, when it
-- wants them). Their ends are written as completion records, one per
-- batch and state, `succeeded` (or `cancelled`, as its record says): the
-- succeeded ones as a count, the others with their task ids, and one of
-- its own for a member with a result (its `r`). A member's end is written
-- once: only by the call that acks its pending entry (for members only
-- counted, the call's own `XACK` of them says how many; for the others,
-- one `XPENDING` before anything is acked says which), so the end is
-- written only of a member still pending before this call acks anything
-- (another script may have acked it first: an earlier call of this ack
-- whose reply was lost, or this instance's own take-over of an entry whose
-- ack was late), and the batch counts each record it is given
-- (batch.lua).
-- Returns the number acknowledged, or -1 when fenced.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return -1
end
-- The batch members' block, at the end, after the unique keys'; their
-- entries still pending before this call acks anything.
local last = #ARGV
local block, pending, counted = nil, {}, {}
if KEYS[4] then
  block = last - tonumber(ARGV[last])
  local untracked = ARGV[4 + tonumber(ARGV[3])] == nil or ARGV[4 + tonumber(ARGV[3])] == ''
  -- A batch's members that are only counted (no results wanted, no
  -- tracking to say which a user cancelled) have their entries acked
  -- here first, a batch at a time: `XACK` counts those still pending,
  -- exactly the members whose end this call writes. The others must be
  -- known one by one: one look at the pending entries between the
  -- members' first and last (one read's entries, mostly: few besides
  -- them), before anything is acked.
  local groups, looked = {}, false
  local i = block + 2
  while i < last do
    local c, wants = tonumber(ARGV[i + 1]), ARGV[i + 2] == '1'
    groups[#groups + 1] = { at = i, c = c, count = untracked and not wants }
    if not groups[#groups].count and not looked then
      looked = true
      for _, entry in ipairs(redis.call('XPENDING', KEYS[1], ARGV[2], ARGV[block], ARGV[block + 1], 100000)) do
        pending[entry[1]] = true
      end
    end
    i = i + 3 + (wants and 3 or 2) * c
  end
  for _, g in ipairs(groups) do
    if g.count then
      local ids = {}
      for m = g.at + 3, g.at + 2 + 2 * g.c, 2 do
        ids[#ids + 1] = ARGV[m + 1]
      end
      local acked_now = 0
      for k = 1, #ids, 1000 do
        acked_now = acked_now + redis.call('XACK', KEYS[1], ARGV[2], unpack(ids, k, math.min(k + 999, #ids)))
      end
      counted[g.at] = acked_now
    end
  end
  last = block - 1
end
local n = tonumber(ARGV[3])
local acked = 0
for i = 4, 3 + n, 1000 do
  acked = acked + redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, i, math.min(i + 999, 3 + n)))
end
local t = tracking(4 + n)
if t then
  local m = tonumber(ARGV[11 + n])
  local streams = 12 + n
  local pairs_ = streams + m
  local all = 0
  for i = streams, pairs_ - 1, 1000 do
    all = all + redis.call('XACK', KEYS[1], ARGV[2], unpack(ARGV, i, math.min(i + 999, pairs_ - 1)))
  end
  local last = pairs_ + 2 * m - 1
  if all == m and redis.call('ZCARD', t.cancels) == 0 then
    t.asked = false
    for i = pairs_, last, 1000 do
      redis.call('HSET', t.tasks, '', PAD, unpack(ARGV, i, math.min(i + 999, last)))
    end
    for i = pairs_, last, 2 do
      t.ended[#t.ended + 1] = ARGV[i]
    end
  else
    for i = pairs_, last, 2 do
      local id = ARGV[i]
      if all == m or not FINAL[state_of(t, id)] then
        if asked(t, id) then
          cancelled(t, id, true)
        else
          redis.call('HSET', t.tasks, id, ARGV[i + 1])
          t.done[id] = 'succeeded'
          t.ended[#t.ended + 1] = id
        end
      end
    end
  end
  acked = acked + all
end
-- One record per batch and state.
if block then
  local i = block + 2
  while i < #ARGV do
    local batch, c, wants = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2] == '1'
    local step = wants and 3 or 2
    local succeeded, cancelled = counted[i] or 0, {}
    local one_by_one = counted[i] == nil
    i = i + 3
    for m = i, one_by_one and i + step * (c - 1) or i - 1, step do
      -- A member an earlier call acked had its end written by that call.
      if pending[ARGV[m + 1]] then
        local id = ARGV[m]
        if t and (t.done[id] == 'cancelled' or (t.asked ~= false and state_of(t, id) == 'cancelled')) then
          cancelled[#cancelled + 1] = id
        elseif wants and ARGV[m + 2] ~= '' then
          redis.call('XADD', completions_of(KEYS[1]), '*', 'b', batch, 't', id, 's', 'succeeded', 'r', ARGV[m + 2])
        else
          succeeded = succeeded + 1
        end
      end
    end
    i = i + step * c
    if succeeded > 0 then
      redis.call('XADD', completions_of(KEYS[1]), '*', 'b', batch, 'n', succeeded, 's', 'succeeded')
    end
    if #cancelled > 0 then
      completed(KEYS[1], batch, table.concat(cancelled, ' '), 'cancelled')
    end
  end
end
flush(t)
if KEYS[3] then
  -- Every task of this call is final (succeeded or cancelled), also one
  -- whose entry an earlier call acked (its reply lost): its key was
  -- freed then, unless a newer task holds it, which `release` leaves.
  local u = tonumber(ARGV[last])
  for i = last - 2 * u, last - 1, 2 do
    release(KEYS[3], ARGV[i + 1], ARGV[i])
  end
end
return acked
